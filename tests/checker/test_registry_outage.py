"""The registry unread for a while says nothing of the producers.

An instance is live while its last heartbeat in the registry topic is fresh. While the checker
cannot fetch the registry - its partition without a leader, its broker away - while the rest of
Kafka serves, no new heartbeat reaches it and every instance it knows ages past
``registry_ttl_s``: the producers are no less alive, and still answer checks over HTTP. The
checker must hold its checks until it reads the registry to its end again, not count that time
toward ``no_producer_timeout_s`` and give up a live producer's committed transactions.

(A broker down altogether stalls the checker's loop on its own writes: no check is made, so
nothing is counted either; that is the single-broker case.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka.admin import AdminClient, NewTopic
from sqlalchemy.orm import sessionmaker

from checker import Checker
from checker.writer import RoundFailed, RoundWriter
from outbox import OutboxProducer, OutboxSettings, ensure_topics
from outbox.kafka_logging import log_to_python
from outbox.protocol import DecidedBy, OpState
from outbox.protocol.topics import topic_settings
from outbox.testing.kafka_cluster import OFFSETS_PARTITIONS, KafkaCluster, java_string_hash
from tests.checker.test_checker import SECRET, Background, checker_settings, wait_for
from tests.kafka_helpers import unique
from tests.producer_fixtures import Topics, evidence_ids
from tests.relay.test_relay import read_topic

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

# Heartbeats every 5 s, the TTL more than twice that (the view current for 6 s after the
# registry's end was last known);
# the transaction committed once the registry has been away for longer than the TTL, so its
# instance has aged out of the view; its first check 4 s after it.
TTL_S, NO_PRODUCER_TIMEOUT_S, FIRST_CHECK_S = 12.0, 8.0, 4.0
#: The one node that holds the registry's only replica.
REGISTRY_NODE = 3


@pytest.fixture
def settings(kafka_cluster: KafkaCluster) -> Iterator[OutboxSettings]:
    """The outbox's topics on the cluster, the registry's one replica on :data:`REGISTRY_NODE`
    (every other topic has three); deleted after the test, which other tests of the cluster
    expect (every topic replicated three times)."""
    settings = OutboxSettings(
        bootstrap_servers=kafka_cluster.bootstrap,
        producer_group="orders",
        topic_prefix=unique("__outbox-registry"),
        partitions=1,
        send_timeout_s=30,
    )
    names = settings.topics
    admin = AdminClient(log_to_python({"bootstrap.servers": kafka_cluster.bootstrap}))
    registry = NewTopic(
        names.registry,
        num_partitions=1,
        replica_assignment=[[REGISTRY_NODE]],
        config=topic_settings(
            names,
            names.registry,
            min_compaction_lag_ms=settings.min_compaction_lag_ms,
            half_retention_ms=settings.half_retention_ms,
            op_retention_ms=settings.op_retention_ms,
        )
        | {"min.insync.replicas": "1"},
    )
    admin.create_topics([registry])[names.registry].result(30)
    ensure_topics(settings)
    yield settings
    if not kafka_cluster.nodes[REGISTRY_NODE].alive():
        kafka_cluster.restart(REGISTRY_NODE)
    for future in admin.delete_topics(list(names.all())).values():
        future.result(60)
    kafka_cluster.wait_in_sync()  # the next test of the cluster finds every replica in sync


def group_coordinated(kafka_cluster: KafkaCluster, *, by_registry_node: bool) -> str:
    """A checker group id whose coordinator is :data:`REGISTRY_NODE` (or another node): the
    leader of its ``__consumer_offsets`` partition (Kafka's ``partitionFor``: the Java hash
    code of the id, made non-negative, modulo the partition count)."""
    deadline = time.monotonic() + 60
    while True:
        leaders = kafka_cluster.leaders("__consumer_offsets")
        for _ in range(100):
            group = unique("checker")
            leader = leaders.get(abs(java_string_hash(group)) % OFFSETS_PARTITIONS)
            if (leader == REGISTRY_NODE) == by_registry_node:
                return group
        assert time.monotonic() < deadline, f"no group coordinated as asked: {leaders}"
        time.sleep(1)  # leaderships moving (a node just restarted): ask again


@pytest.mark.parametrize(
    "session_restarts",
    [
        pytest.param(False, id="coordinator-elsewhere"),
        # As in CI once: the checker's group coordinator on the registry's node, so its member's
        # session times out with it and its session may end; and a round's write failing once
        # the view has lapsed, so that a new session starts during the outage whatever the
        # coordinator's failover does. A new session's reader of the registry used to know
        # nothing of the outage; now its clients are made anew (on a partition without a
        # leader), the view kept.
        pytest.param(True, id="session-restarted"),
    ],
)
def test_a_registry_without_a_leader_for_longer_than_the_ttl_and_the_limit_gives_up_nothing(
    kafka_cluster: KafkaCluster,
    settings: OutboxSettings,
    session_factory: sessionmaker,
    engine: sa.Engine,
    session_restarts: bool,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="checker")
    failed_writes: list[str] = []
    if session_restarts:
        real_write = RoundWriter.write

        def fail_once(self: RoundWriter, *args: Any) -> None:
            # once the view has lapsed: the new session renews the reader's clients then
            if "was last known" in checker.ready()[1] and not failed_writes:
                failed_writes.append("failed")
                raise RoundFailed("the round's Kafka transaction did not commit: a test's")
            real_write(self, *args)

        monkeypatch.setattr(RoundWriter, "write", fail_once)
    topics = Topics(kafka_cluster.bootstrap, settings)
    producer = OutboxProducer(settings)
    checker = Checker(
        checker_settings(
            kafka_cluster.bootstrap,
            settings.topic_prefix,
            group_id=group_coordinated(kafka_cluster, by_registry_node=session_restarts),
            registry_ttl_s=TTL_S,
            no_producer_timeout_s=NO_PRODUCER_TIMEOUT_S,
            transaction_timeout_s=FIRST_CHECK_S,
        )
    )
    running = Background(checker)
    try:
        producer.serve_checks(engine=engine, secret=SECRET)
        wait_for(lambda: checker.ready()[0], timeout=120)
        # Given the registry's one broker gone for longer than the TTL, the rest of the cluster
        # serving, and the producer serving its checks
        kafka_cluster.kill(REGISTRY_NODE)
        time.sleep(TTL_S + 1)
        if session_restarts:
            wait_for(lambda: failed_writes and checker.sessions > 1, timeout=120)
        # When a transaction commits and its op is lost
        producer.kafka.send_op = lambda op: False  # type: ignore[method-assign]
        with producer.transaction(session_factory) as txn:
            txn.send(unique("orders"), b"committed", key=b"a")
        assert txn.txn_id in evidence_ids(engine)
        wait_for(lambda: txn.txn_id in checker.tracker.pending, timeout=60)
        # Then for longer than its first check and the limit together, the checker gives up
        # nothing, and says why it waits: since when it does not know the registry's end
        time.sleep(FIRST_CHECK_S + NO_PRODUCER_TIMEOUT_S + 4)
        assert checker.stats.given_up == 0, checker.stats
        assert checker.stats.held > 0, checker.stats
        assert "was last known read to its end" in checker.ready()[1]
        # And once the registry is back, the producer's answer decides it: committed
        kafka_cluster.restart(REGISTRY_NODE)
        wait_for(lambda: any(o.txn_id == txn.txn_id for o in topics.ops()), timeout=120)
        [op] = [o for o in topics.ops() if o.txn_id == txn.txn_id]
        assert (op.state, op.decided_by) == (OpState.COMMIT, DecidedBy.CHECKER), op.reason
        assert read_topic(kafka_cluster.bootstrap, settings.topics.dead_letter) == []
        assert checker.stats.given_up == 0
        # having held "no live instance" one TTL more once the registry was read again, while
        # the heartbeats came back (a new session's reader knew of no lapse to end)
        assert any("to its end again" in r.getMessage() for r in caplog.records)
    finally:
        running.stop()
        producer.close()

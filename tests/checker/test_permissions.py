"""The checker run as a principal a cluster's ACLs limit (tests/acl_kafka.py: Kafka's own
``StandardAuthorizer``, SASL PLAIN).

The checker learns which producer instances are live from the registry topic. Kafka refusing it
that topic (an ACL left out: the registry is the one internal topic the checker only reads)
looked like a producer group with no live instance: the checker's reads failed silently, and
after ``no_producer_timeout_s`` it gave up transactions a live producer would have answered for
- committed in the database, dead-lettered instead of delivered.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from confluent_kafka.admin import AclOperation, ResourceType  # type: ignore[attr-defined]

from checker import Checker
from checker.instances import LiveInstances
from outbox import OutboxProducer, OutboxSettings
from outbox.protocol import DecidedBy, OpState
from outbox.topics import ensure_topics
from tests.acl_kafka import AclKafka
from tests.checker.test_checker import SECRET, Background, checker_settings, wait_for
from tests.kafka_helpers import unique
from tests.producer_fixtures import Topics

pytestmark = pytest.mark.integration

CHECKER = "checker"
#: The checker's no_producer_timeout_s (3 s) and two check intervals (1 s), and a margin.
PAST_NO_PRODUCER_TIMEOUT_S = 3 + 2 * 1 + 2


def grant_the_checker(
    broker: AclKafka, settings: OutboxSettings, group_id: str, *, registry: bool
) -> None:
    """What docs/checks.md ("Kafka permissions") asks for the checker's principal, the
    registry's Read aside unless ``registry``."""
    names = settings.topics
    for topic in (names.half, names.op, names.dead_letter, names.state):
        broker.allow(
            CHECKER,
            ResourceType.TOPIC,
            topic,
            AclOperation.READ,
            AclOperation.WRITE,
            AclOperation.DESCRIBE,
        )
    broker.allow(CHECKER, ResourceType.TOPIC, names.registry, AclOperation.DESCRIBE)
    if registry:
        broker.allow(CHECKER, ResourceType.TOPIC, names.registry, AclOperation.READ)
    broker.allow(CHECKER, ResourceType.GROUP, group_id, AclOperation.READ)
    broker.allow(
        CHECKER,
        ResourceType.TRANSACTIONAL_ID,
        f"{group_id}-",
        AclOperation.WRITE,
        AclOperation.DESCRIBE,
    )


def fresh_topics(broker: AclKafka, prefix: str) -> OutboxSettings:
    """Group "orders"'s settings on new internal topics (one partition) under ``prefix``, made
    by the super user."""
    settings = OutboxSettings(
        bootstrap_servers=broker.plain,
        producer_group="orders",
        topic_prefix=unique(prefix),
        partitions=1,
    )
    ensure_topics(settings)
    return settings


def committed_without_its_op(producer: OutboxProducer, session_factory: Any) -> str:
    """A transaction committed in the database whose COMMIT op never reached the op topic (the
    producer stopped between the two): only the check endpoint knows."""
    send_op = producer.kafka.send_op
    producer.kafka.send_op = lambda op: False  # type: ignore[method-assign]
    try:
        with producer.transaction(session_factory) as txn:
            txn.send("orders", b"paid", key=b"order-1")
    finally:
        producer.kafka.send_op = send_op  # type: ignore[method-assign]
    return txn.txn_id


def test_a_registry_the_checker_may_not_read_holds_its_checks_instead_of_giving_up(
    acl_broker: AclKafka,
    engine: Any,
    session_factory: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = fresh_topics(acl_broker, "__outbox-acl-checker")
    topics = Topics(acl_broker.plain, settings)
    checking = checker_settings(
        acl_broker.sasl,
        settings.topic_prefix,
        no_producer_timeout_s=3,
        kafka=acl_broker.librdkafka_login(CHECKER),
    )
    grant_the_checker(acl_broker, settings, checking.group_id, registry=False)
    producer = OutboxProducer(settings)
    checker = Checker(checking)
    running: Background | None = None
    try:
        producer.serve_checks(engine=engine, secret=SECRET)  # live, and it would answer
        txn_id = committed_without_its_op(producer, session_factory)
        with caplog.at_level(logging.ERROR, logger="checker"):
            running = Background(checker)
            # Given a checker caught up that may not read the registry, past
            # no_producer_timeout_s and a few check intervals
            wait_for(lambda: "cannot be read" in checker.ready()[1], timeout=60)
            wait_for(lambda: checker.stats.held > 0, timeout=30)
            time.sleep(PAST_NO_PRODUCER_TIMEOUT_S)
            # Then it has given up nothing, counted no time toward it, and says why it waits
            assert topics.ops() == []
            assert checker.stats.given_up == 0
            assert checker.stats.unreachable == 0 and checker.stats.checks == 0
            ready, why = checker.ready()
            assert not ready and settings.topics.registry in why and "cannot be read" in why
        said = "\n".join(r.getMessage() for r in caplog.records)
        assert settings.topics.registry in said and "Read" in said
        # When Read is granted, it finds the producer, which answers COMMIT
        acl_broker.allow(CHECKER, ResourceType.TOPIC, settings.topics.registry, AclOperation.READ)
        wait_for(lambda: any(o.txn_id == txn_id for o in topics.ops()), timeout=60)
        [op] = topics.ops()
        assert (op.state, op.decided_by) == (OpState.COMMIT, DecidedBy.CHECKER)
        assert checker.stats.given_up == 0
    finally:
        if running is not None:
            running.stop()
        producer.close()


@pytest.mark.parametrize("describe", [True, False], ids=["no-read", "no-acl"])
def test_the_registry_reader_knows_when_kafka_refuses_it_and_when_it_may_read_again(
    acl_broker: AclKafka, describe: bool
) -> None:
    """librdkafka tells a refused fetch once, and a partition's end only on reaching a new one:
    an idle registry (no producer heartbeating) granted again said neither, and the checker
    would have waited on it for ever. With no ACL at all Kafka refuses the topic in metadata,
    which librdkafka does not report for a partition it never read."""
    settings = fresh_topics(acl_broker, "__outbox-acl-registry")
    registry = settings.topics.registry
    if describe:
        acl_broker.allow(CHECKER, ResourceType.TOPIC, registry, AclOperation.DESCRIBE)
    login = {"bootstrap.servers": acl_broker.sasl, **acl_broker.librdkafka_login(CHECKER)}
    instances = LiveInstances(login, registry, 30)

    def polled_until(done: Any, seconds: float) -> str | None:
        deadline = time.monotonic() + seconds
        while not done(instances.unread) and time.monotonic() < deadline:
            instances.poll()
            time.sleep(0.2)
        return instances.unread

    try:
        assert "is not read to its end yet" in str(instances.unread)
        refused = polled_until(lambda why: why is not None and "cannot be read" in why, 30)
        assert "cannot be read" in str(refused) and "Topic authorization failed" in str(refused)
        acl_broker.allow(CHECKER, ResourceType.TOPIC, registry, AclOperation.READ)
        assert polled_until(lambda why: why is None, 30) is None
        # taken away, then granted again: the registry idle all along
        acl_broker.revoke(CHECKER, ResourceType.TOPIC, registry, AclOperation.READ)
        assert "cannot be read" in str(polled_until(lambda why: why is not None, 30))
        acl_broker.allow(CHECKER, ResourceType.TOPIC, registry, AclOperation.READ)
        assert polled_until(lambda why: why is None, 30) is None
    finally:
        instances.close()


def test_a_checker_whose_principal_may_not_read_its_group_says_what_to_grant(
    acl_broker: AclKafka, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, such a checker logged nothing at all and its readiness said only "no partition
    assigned": its consumer's errors were dropped (checker/session.py ``_route``)."""
    settings = fresh_topics(acl_broker, "__outbox-acl-group")
    checking = checker_settings(
        acl_broker.sasl, settings.topic_prefix, kafka=acl_broker.librdkafka_login(CHECKER)
    )
    # Given a checker granted all docs/checks.md asks for but Read on its group
    grant_the_checker(acl_broker, settings, checking.group_id, registry=True)
    acl_broker.revoke(CHECKER, ResourceType.GROUP, checking.group_id, AclOperation.READ)
    checker = Checker(checking)
    grant = f"grant the checker's principal Read on group {checking.group_id}"
    with caplog.at_level(logging.WARNING, logger="checker"):
        running = Background(checker)
        try:
            # Then its log and its readiness say what to grant
            wait_for(lambda: grant in checker.ready()[1], timeout=60)
            assert any(grant in r.getMessage() for r in caplog.records)
            assert "Group authorization failed" in checker.ready()[1]
            # and once granted, the same session joins and catches up
            acl_broker.allow(CHECKER, ResourceType.GROUP, checking.group_id, AclOperation.READ)
            wait_for(lambda: checker.ready() == (True, "caught up"), timeout=90)
            assert checker.sessions == 1
        finally:
            running.stop()

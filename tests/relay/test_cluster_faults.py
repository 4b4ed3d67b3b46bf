"""The whole pipeline on three brokers (replication factor 3, ``min.insync.replicas=2``) while
brokers fail: what production runs, and what the README's mitigation of KAFKA-20734 relies on.

Producers commit orders on PostgreSQL through the outbox; two relays and two checkers run as
processes. The broker that leads the most half and op partitions and relay transaction
coordinators is killed with SIGKILL, left down, and started again - five times, never the same
broker twice in a row - and then all three are restarted cleanly, one after another. An
independent read_committed reader and the orders table then must agree: nothing lost, nothing
twice, nothing of a rolled-back order, each key in order; and the Spark audit is clean.

Runs once per Kafka release (the pinned one and the newest, ``kafka_cluster``'s parameter), in
``make test-cluster``; docs/clusters.md has the figures it printed.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from checker.audit.cli import EXIT_CLEAN, main
from checker.audit.findings import FINDINGS
from outbox.testing.kafka_cluster import KafkaCluster
from tests.checker.processes import CheckerProcess
from tests.kafka_helpers import unique
from tests.relay.cluster_load import OrderLoad, Reader, final_check, unread
from tests.relay.harness import RelayProcess, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

KILLS = 5
DOWN_S = 5  # a killed broker stays down at least this long (its failover must not need it)
SKIPPED = "these partitions are likely deleted already and hence can be skipped"


def victim(cluster: KafkaCluster, load: OrderLoad, relays: list[RelayProcess], last: int) -> int:
    """The broker leading the most half and op partitions and relay coordinators (not
    ``last``, so the kills go round the cluster)."""
    score: Counter[int] = Counter()
    for topic in (load.settings.topics.half, load.settings.topics.op):
        score.update(cluster.leaders(topic).values())
    for relay in relays:
        tid = f"{relay.env['OUTBOX_RELAY_GROUP_ID']}-{relay.name}"
        score[cluster.coordinator(tid)] += 2
    return max((n for n in cluster.nodes if n != last), key=lambda n: score[n])


def recovered(reader: Reader, load: OrderLoad, since: float, timeout: float = 180) -> float:
    """Seconds from ``since`` until the reader saw a record of a transaction begun after it."""
    wait_for(lambda: reader.first_after(load.began, since) is not None, timeout, "recovery")
    seen = reader.first_after(load.began, since)
    assert seen is not None
    return seen - since


def kill_and_restart(cluster: KafkaCluster, load: OrderLoad, reader: Reader, node: int) -> str:
    """``kill -9`` one broker, wait for the pipeline to recover without it, start it again."""
    since = time.monotonic()
    cluster.kill(node)
    recovery = recovered(reader, load, since)
    time.sleep(max(0.0, since + DOWN_S - time.monotonic()))
    cluster.restart(node)
    back = time.monotonic() - since
    in_sync = cluster.wait_in_sync()
    line = (
        f"kill -9 broker {node}: new records read {recovery:.1f} s after the kill; "
        f"restarted and serving at {back:.1f} s, replicas in sync {in_sync:.1f} s later"
    )
    print(line, flush=True)
    return line


def clean_restart(cluster: KafkaCluster, load: OrderLoad, reader: Reader, node: int) -> str:
    """Stop one broker cleanly (SIGTERM), start it again, wait until it is back in sync."""
    since = time.monotonic()
    cluster.stop(node)
    stopped = time.monotonic() - since
    cluster.restart(node)
    in_sync = cluster.wait_in_sync()
    recovery = recovered(reader, load, since)
    line = (
        f"clean restart of broker {node}: stopped in {stopped:.1f} s, new records read "
        f"{recovery:.1f} s after the SIGTERM, replicas in sync {in_sync:.1f} s after it served"
    )
    print(line, flush=True)
    return line


def missing(load: OrderLoad, reader: Reader, committed: set[str]) -> str:
    """How many committed messages the reader has not seen, and how many of those lost their
    producer's op (a checker must decide them) - which side to look at first."""
    lost = committed - set(reader.first_seen())
    orders = {value.rsplit("/", 1)[0] for value in lost}
    txns = {order: txn for txn, order in list(load.order_of.items())}
    no_op = sum(1 for o in orders if not load.op_acked.get(txns.get(o, ""), False))
    return (
        f"{len(lost)} messages of {len(orders)} orders not read, {no_op} of those orders "
        f"without an acknowledged op from their producer; some: {sorted(lost)[:5]}"
    )


def dead_lettering(log: Path) -> str:
    """The relay log's lines about dead letters (a rejected COMMIT is a transaction never
    delivered)."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return "\n".join(line for line in lines if "dead-letter" in line) or "none"


def warnings(log: Path, last: int = 20) -> str:
    """A service log's last warnings and errors (a Kafka call retried, a session restarted):
    what a stalled service was retrying before its stacks were taken."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    levels = (" WARNING ", " ERROR ", " CRITICAL ")
    return "\n".join([line for line in lines if any(x in line for x in levels)][-last:]) or "none"


def stall_report(
    err: AssertionError,
    bootstrap: str,
    load: OrderLoad,
    reader: Reader,
    relays: list[RelayProcess],
    checkers: list[CheckerProcess],
) -> str:
    """What a timed-out wait leaves to read: the load's failures, the messages not read, what
    a fresh read of the topic misses at that moment (if the same, the pipeline stalled; if
    not, the reader did), and each relay's and checker's metrics and threads' stacks."""
    load.stop()
    reader_state = (
        f"the reader holds partitions {reader.assignment()}; a fresh read_committed read of "
        f"the topic now misses: {unread(bootstrap, load)}"
    )
    relay_states = "\n".join(
        f"{relay.name} metrics:\n{relay.metrics()}\n{relay.name} stacks:\n{relay.stacks()}\n"
        f"{relay.name} dead letters:\n{dead_lettering(relay.log)}\n"
        f"{relay.name} last warnings:\n{warnings(relay.log)}"
        for relay in relays
    )
    checker_states = "\n".join(
        f"checker-{i} (stuck exits: {checker.stuck_exits}) metrics:\n{checker.metrics()}\n"
        f"checker-{i} stacks:\n{checker.stacks()}\n"
        f"checker-{i} last warnings:\n{warnings(checker.log)}"
        for i, checker in enumerate(checkers)
    )
    return (
        f"{err}; producer failures {dict(load.failures)}; "
        f"{missing(load, reader, load.committed())}\n{reader_state}\n{relay_states}\n"
        f"{checker_states}"
    )


def audit(bootstrap: str, load: OrderLoad, out: Path) -> tuple[int, dict[str, int]]:
    """The audit's CLI over the outbox topics, with the evidence table over JDBC."""
    code = main(
        [
            "--bootstrap-servers",
            bootstrap,
            "--topic-prefix",
            load.settings.topic_prefix,
            "--jdbc-url",
            load.db_url,
            "--as-of",
            "now+30s",
            "--grace",
            "10s",
            "--window",
            "20s",
            "--out",
            str(out),
            "--quiet",
        ]
    )
    summary = json.loads((out / "summary.json").read_text())
    return code, {name: f["count"] for name, f in summary["findings"].items()}


@pytest.mark.timeout(1800)  # the cluster's start, 8 broker failures, the drain and the audit
def test_brokers_killed_and_restarted_under_load_lose_and_repeat_nothing(
    kafka_cluster: KafkaCluster, postgres_url: str, spark: Any, tmp_path: Path
) -> None:
    cluster = kafka_cluster
    started = time.monotonic()
    load = OrderLoad(cluster.bootstrap, postgres_url)
    reader = Reader(cluster.bootstrap, load.topic)
    relay_group, checker_group = unique("relay"), unique("checker")
    relays = [
        RelayProcess(
            cluster.bootstrap, load.settings.topic_prefix, relay_group, f"relay-{i}", tmp_path
        )
        for i in range(2)
    ]
    checkers = [
        CheckerProcess(
            cluster.bootstrap,
            load.settings.topic_prefix,
            checker_group,
            f"checker-{i}",
            tmp_path / f"checker-{i}.log",
        )
        for i in range(2)
    ]
    for relay in relays:
        relay.supervise()  # librdkafka can hang after a broker restart; the relay then exits 3
        relay.start()
    for i, checker in enumerate(checkers):
        checker.supervise(f"checker-{i}")  # a checker can hang as a relay can (outbox.watchdog)
        checker.start()
    load.start()
    report: list[str] = []
    stalled = ""
    try:
        wait_for(lambda: len(reader.first_seen()) > 200, 180, "promotions before the first kill")
        # When the busiest broker is killed, left down, and started again, five times
        last = 0
        for _ in range(KILLS):
            last = victim(cluster, load, relays, last)
            report.append(kill_and_restart(cluster, load, reader, last))
        # And then all three are restarted cleanly, one after another
        for node in cluster.nodes:
            report.append(clean_restart(cluster, load, reader, node))
        load.stop()
        # Then, once the relays have caught up, the reader saw every committed message
        committed = load.committed()
        wait_for(lambda: set(reader.first_seen()) >= committed, 240, "every committed message")
        time.sleep(10)  # the checkers decide the last orphans; a late duplicate shows up now
    except AssertionError as err:
        # A wait timed out. Fail after the final read and the audit, which say whether the
        # messages are on the topic (the reader missed them) or not (the pipeline did), and
        # with what the relays were doing then
        stalled = stall_report(err, cluster.bootstrap, load, reader, relays, checkers)
    finally:
        load.stop()
        for service in (*relays, *checkers):
            service.stop()
        reader.stop()
        load.close()
    counts = final_check(cluster.bootstrap, load)
    # Messages missing now may still come (a transaction's markers written late): read again
    # after the audit, which also reads the topic a minute later
    unread_then = unread(cluster.bootstrap, load) if counts["lost"] else "none"
    code, findings = audit(cluster.bootstrap, load, tmp_path / "audit")
    unread_later = unread(cluster.bootstrap, load) if counts["lost"] else "none"
    skips = cluster.logs().count(SKIPPED)
    print(
        f"Kafka {cluster.version}, {len(cluster.nodes)} brokers, RF 3, min ISR 2: "
        f"{counts} in {time.monotonic() - started:.0f} s; producer failures "
        f"{dict(load.failures)}; relay stuck exits {[r.stuck_exits for r in relays]}; "
        f"checker stuck exits {[c.stuck_exits for c in checkers]}; "
        f"KAFKA-20734 skip lines in broker logs: {skips}\n" + "\n".join(report)
    )
    assert not stalled, (
        f"{stalled}\nfinal read of the topic: {counts}; committed messages not read: "
        f"{unread_then}; after the audit: {unread_later}\naudit: {findings}"
    )
    assert counts["committed"] > 1000, counts
    assert {k: v for k, v in counts.items() if k != "committed"} == {
        "lost": 0,
        "duplicated": 0,
        "delivered_after_rollback": 0,
        "keys_out_of_order": 0,
    }, f"committed messages not read: {unread_then}; after the audit: {unread_later}"
    assert findings == dict.fromkeys(FINDINGS, 0), findings
    assert code == EXIT_CLEAN

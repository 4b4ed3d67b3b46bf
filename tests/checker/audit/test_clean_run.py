"""10,000 real transactions through the producer library, the relay and the checker: clean.

Producers on 8 threads commit and roll back through ``producer.transaction`` on PostgreSQL;
2% of them lose their op record (as if the process died right after its DB commit or
rollback), so the checker resolves them from the evidence table. Then the audit, through its
CLI, with the evidence table over JDBC, finds nothing and exits 0.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import sessionmaker

from checker import Checker, CheckerSettings
from checker.audit.cli import EXIT_CLEAN, main
from checker.audit.findings import FINDINGS
from outbox import OutboxProducer, OutboxSettings, ensure_topics
from relay import Relay, RelaySettings
from tests.checker.audit.seeded import fresh_database
from tests.kafka_helpers import create_topic, unique
from tests.producer_fixtures import orders, orders_metadata
from tests.relay.test_relay import read_topic

pytestmark = [pytest.mark.integration, pytest.mark.scale]

TRANSACTIONS = 10_000
SECRET = "audit-clean-run-secret"


class Declined(Exception):
    pass


class LostOps:
    """Drops the op record of chosen transactions, as a crash after the DB outcome would."""

    def __init__(self, producer: OutboxProducer) -> None:
        self.local = threading.local()
        self.dropped = 0
        self._lock = threading.Lock()
        self._send_op = producer.kafka.send_op
        producer.kafka.send_op = self.send_op  # type: ignore[method-assign]

    def send_op(self, op: Any) -> bool:
        if getattr(self.local, "drop", False):
            with self._lock:
                self.dropped += 1
            return False
        return self._send_op(op)


def wait_for(predicate: Callable[[], bool], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.5)


def test_ten_thousand_real_transactions_audit_clean(
    spark: Any, kafka_bootstrap: str, postgres_url: str, tmp_path
) -> None:
    db_url = fresh_database(postgres_url)
    engine = sa.create_engine(db_url, pool_size=10)
    orders_metadata.create_all(engine)
    Session = sessionmaker(engine)
    settings = OutboxSettings(
        bootstrap_servers=kafka_bootstrap,
        producer_group=unique("orders"),
        topic_prefix=unique("__outbox-clean"),
        partitions=3,
    )
    ensure_topics(settings)
    topic = unique("orders")
    create_topic(kafka_bootstrap, topic, partitions=3)
    producer = OutboxProducer(settings)
    producer.serve_checks(engine=engine, secret=SECRET)
    lost_ops = LostOps(producer)
    relay = Relay(
        RelaySettings(
            bootstrap_servers=kafka_bootstrap,
            topic_prefix=settings.topic_prefix,
            group_id=unique("relay"),
        )
    )
    checker = Checker(
        CheckerSettings(
            bootstrap_servers=kafka_bootstrap,
            secret=SECRET,
            topic_prefix=settings.topic_prefix,
            group_id=unique("checker"),
            transaction_timeout_s=1,
            check_interval_s=1,
            check_max=5,
        )
    )
    services = [threading.Thread(target=s.run, daemon=True) for s in (relay, checker)]
    for thread in services:
        thread.start()
    committed: dict[str, int] = {}
    lock = threading.Lock()

    def place(i: int) -> None:
        rng = random.Random(i)
        lost_ops.local.drop = rng.random() < 0.02
        messages = 1 + (i % 3 == 0)
        try:
            with producer.transaction(Session) as txn:
                txn.session.execute(orders.insert().values(id=f"order-{i}", amount=i))
                for m in range(messages):
                    txn.send(topic, f"order-{i}/{m}".encode(), key=f"customer-{i % 97}".encode())
                if rng.random() < 0.1:
                    raise Declined
            with lock:
                committed[txn.txn_id] = messages
        except Declined:
            pass

    # Given 10,000 transactions, 10% declined and 2% of the op records lost
    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(place, range(TRANSACTIONS)))
    expected = sum(committed.values())

    def delivered() -> int:
        return len(read_topic(kafka_bootstrap, topic))

    # When the relay and the checker have done their work
    wait_for(lambda: delivered() >= expected)
    wait_for(
        lambda: checker.stats.resolved_commit + checker.stats.resolved_rollback >= lost_ops.dropped
    )
    settled = time.monotonic()
    relay.close()
    checker.close()
    for thread in services:
        thread.join(30)
    producer.close()
    assert lost_ops.dropped > 100 and checker.stats.given_up == 0

    # Then the audit, with the evidence table over JDBC, is clean and says so with exit 0
    out = tmp_path / "audit"
    code = main(
        [
            "--bootstrap-servers",
            kafka_bootstrap,
            "--topic-prefix",
            settings.topic_prefix,
            "--jdbc-url",
            db_url,
            "--as-of",
            "now+30s",  # every decision past the grace period, every half the window
            "--grace",
            "10s",
            "--window",
            "20s",
            "--out",
            str(out),
            "--quiet",
        ]
    )
    audited = time.monotonic()
    print(
        f"{TRANSACTIONS} transactions placed, promoted and resolved in {settled - started:.1f} s; "
        f"audited (CLI, JDBC evidence) in {audited - settled:.1f} s"
    )
    summary = json.loads((out / "summary.json").read_text())
    assert {name: f["count"] for name, f in summary["findings"].items()} == dict.fromkeys(
        FINDINGS, 0
    )
    assert code == EXIT_CLEAN
    stats = summary["statistics"]
    assert stats["transactions"] == TRANSACTIONS
    assert stats["by_state"]["COMMIT"] == len(committed)
    assert stats["messages_delivered"] == expected
    assert stats["by_decider"]["checker"] == lost_ops.dropped

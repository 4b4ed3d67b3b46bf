"""Baseline C really is an outbox: Debezium's connector publishes committed rows only, each to
the topic its ``aggregatetype`` names, keyed by ``aggregateid`` (bench/connect_worker.py)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from confluent_kafka import Consumer
from sqlalchemy.orm import sessionmaker

from bench.baseline_c import create_outbox_table, event_row, outboxevent, place_order_c
from bench.connect_worker import SEQ_HEADER, ConnectWorker, DebeziumSettings
from bench.workload import CUSTOMER_KEYS, PAYLOAD, business_write, create_schema
from outbox.testing import HarnessSettings
from tests.kafka_helpers import create_topic, unique

# Kafka Connect is a third system (a JVM of its own, 34 s or more): make test-cluster runs it.
pytestmark = [pytest.mark.integration, pytest.mark.cluster]


@pytest.fixture
def logical_db(postgres_url: str) -> Iterator[str]:
    """A fresh database on the harness's PostgreSQL, which runs with ``wal_level=logical``."""
    admin = sa.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        level = conn.execute(sa.text("SHOW wal_level")).scalar()
        if level != "logical":
            pytest.fail(f"PostgreSQL runs with wal_level={level}; Debezium needs logical")
        name = f"dbz_{uuid.uuid4().hex[:8]}"
        conn.execute(sa.text(f"CREATE DATABASE {name}"))
    admin.dispose()
    yield sa.make_url(postgres_url).set(database=name).render_as_string(hide_password=False)


def read_until(bootstrap: str, topics: list[str], last: str, timeout: float = 60) -> list[tuple]:
    """(topic, key, value, seq) of every record read_committed until ``last``'s seq arrives."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("dbz-reader"),
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe(topics)
    seen: list[tuple] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and last not in [s[3] for s in seen]:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            seq = dict(msg.headers() or []).get(SEQ_HEADER, b"").decode()
            seen.append((msg.topic(), msg.key(), msg.value(), seq))
        # a straggler (a duplicate, or the rolled-back row) would come right behind
        end = time.monotonic() + 2
        while time.monotonic() < end:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                seq = dict(msg.headers() or []).get(SEQ_HEADER, b"").decode()
                seen.append((msg.topic(), msg.key(), msg.value(), seq))
    finally:
        consumer.close()
    return seen


def test_debezium_publishes_committed_rows_to_their_topic_once_and_never_a_rolled_back_one(
    kafka_bootstrap: str, logical_db: str, harness_settings: HarnessSettings
) -> None:
    # Given: the business tables, the outbox table, two real topics and a running connector
    engine = sa.create_engine(logical_db, poolclass=sa.pool.NullPool)
    create_schema(engine)
    create_outbox_table(engine)
    orders, refunds = unique("dbz-orders"), unique("dbz-refunds")
    for topic in (orders, refunds):
        create_topic(kafka_bootstrap, topic)
    slot = f"dbz_{uuid.uuid4().hex[:8]}"
    worker = ConnectWorker(
        harness_settings, DebeziumSettings(bootstrap=kafka_bootstrap, db_url=logical_db, slot=slot)
    )
    factory = sessionmaker(engine)
    try:
        worker.start()
        # When: three orders commit, one rolls back, a refund and one more order commit
        for seq, customer in (("1", 1), ("2", 2), ("3", 3)):
            place_order_c(factory, orders, customer, 1, {SEQ_HEADER: seq})
        with pytest.raises(RuntimeError), factory() as session, session.begin():
            business_write(session, 4)
            session.execute(outboxevent.insert(), [event_row(orders, 4, "rolled-back")])
            raise RuntimeError("the business logic fails after the outbox insert")
        place_order_c(factory, refunds, 5, 1, {SEQ_HEADER: "refund"})
        place_order_c(factory, orders, 6, 1, {SEQ_HEADER: "last"})
        read_until(kafka_bootstrap, [orders, refunds], "last")
        # ... and one more while the connector is stopped (the bench's relay path does this)
        worker.stop_connector()
        place_order_c(factory, orders, 7, 1, {SEQ_HEADER: "resumed"})
        worker.resume_connector()
        seen = read_until(kafka_bootstrap, [orders, refunds], "resumed")
    finally:
        worker.close()
        engine.dispose()

    # Then: every committed row once, on its topic, keyed by its aggregate; no rolled-back row
    assert sorted((topic, seq) for topic, _, _, seq in seen) == sorted(
        [
            (orders, "1"),
            (orders, "2"),
            (orders, "3"),
            (refunds, "refund"),
            (orders, "last"),
            (orders, "resumed"),
        ]
    )
    keys = {seq: key for _, key, _, seq in seen}
    assert keys == {
        "1": CUSTOMER_KEYS[1],
        "2": CUSTOMER_KEYS[2],
        "3": CUSTOMER_KEYS[3],
        "refund": CUSTOMER_KEYS[5],
        "last": CUSTOMER_KEYS[6],
        "resumed": CUSTOMER_KEYS[7],
    }
    assert all(value == PAYLOAD for _, _, value, _ in seen)

"""Fixtures for tests that produce: fresh internal topics per test, a producer, a migrated DB."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import sessionmaker

from outbox import OutboxProducer, OutboxSettings, ensure_topics, migrations
from outbox.protocol import HalfRecord, OpRecord, decode_half, decode_op
from outbox.testing import HarnessSettings, RunningService, start_kafka
from tests.kafka_helpers import read_to_end, unique

orders_metadata = sa.MetaData()
orders = sa.Table(
    "orders",
    orders_metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("amount", sa.Integer, nullable=False),
)


def settings_on_a_fresh_prefix(bootstrap: str) -> OutboxSettings:
    """The tests' producer settings under a prefix of their own, whose topics nobody made yet."""
    return OutboxSettings(
        bootstrap_servers=bootstrap,
        producer_group="orders",
        topic_prefix=unique("__outbox-test"),
        partitions=3,
        send_timeout_s=5,
        send_attempts=2,
        # tests read the op topic as soon as a transaction returns; the one-way default
        # (tested on its own) would leave that a race
        wait_for_op=True,
    )


@pytest.fixture
def outbox_settings(kafka_bootstrap: str) -> OutboxSettings:
    settings = settings_on_a_fresh_prefix(kafka_bootstrap)
    ensure_topics(settings)
    return settings


@pytest.fixture
def producer(outbox_settings: OutboxSettings) -> Iterator[OutboxProducer]:
    with OutboxProducer(outbox_settings) as p:
        yield p


@pytest.fixture
def doomed_kafka(harness_settings: HarnessSettings) -> Iterator[RunningService]:
    """A broker of this test's own, so stopping it disturbs nobody else."""
    service = start_kafka(harness_settings, provider="local")
    yield service
    service.stop()


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    migrations.upgrade(db_url)
    engine = sa.create_engine(db_url)
    orders_metadata.create_all(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def session_factory(engine: sa.Engine) -> sessionmaker:
    return sessionmaker(engine)


@dataclass
class Topics:
    """What is on the internal topics, read back from the broker."""

    bootstrap: str
    settings: OutboxSettings

    def _read(self, topic: str) -> list:
        """Every record a read_committed consumer sees now, read to each partition's end (EOF):
        the op topic carries the checker's transaction markers, which no consumer receives."""
        return read_to_end(self.bootstrap, topic, range(self.settings.partitions))

    def halves(self) -> list[HalfRecord]:
        return [
            decode_half(
                value=m.value(),
                headers=m.headers(),
                partition=m.partition(),
                offset=m.offset(),
                timestamp_ms=m.timestamp()[1],
            )
            for m in self._read(self.settings.topics.half)
        ]

    def ops(self) -> list[OpRecord]:
        found = []
        for m in self._read(self.settings.topics.op):
            op = decode_op(m.key(), m.value(), partition=m.partition(), offset=m.offset())
            if op is not None:
                found.append(op)
        return found


@pytest.fixture
def topics(kafka_bootstrap: str, outbox_settings: OutboxSettings) -> Topics:
    return Topics(kafka_bootstrap, outbox_settings)


def place_order(
    producer: OutboxProducer,
    session_factory: sessionmaker,
    topic: str,
    key: bytes | str,
    attempted: list[str],
) -> str:
    """One order row and its message to ``topic`` in one transaction (the context manager); the
    order's id goes into ``attempted`` before the transaction opens, whatever it then raises."""
    order_id = f"order-{uuid.uuid4().hex[:12]}"
    attempted.append(order_id)
    with producer.transaction(session_factory) as txn:
        assert txn.session is not None
        txn.session.execute(orders.insert().values(id=order_id, amount=1))
        txn.send(topic, order_id, key=key)
    return order_id


def order_ids(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(orders.c.id).order_by(orders.c.id)).scalars())


def evidence_ids(engine: sa.Engine) -> dict[str, str]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT txn_id, kind FROM outbox_evidence")).all()
    return {r[0]: r[1] for r in rows}

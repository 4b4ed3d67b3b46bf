"""Baseline C, what Kafka users pick most often: Debezium's outbox on Kafka Connect.

The business write and one row in a Debezium-shaped outbox table commit in one PostgreSQL
transaction (the producer side has baseline B's shape); Debezium's PostgreSQL connector reads
the rows from the WAL and its outbox EventRouter publishes them (bench/connect_worker.py)::

    BEGIN;
    UPDATE bench_counters ...; INSERT INTO bench_orders ...;      -- the business write
    INSERT INTO outboxevent (id, aggregatetype, aggregateid, type, payload, seq)
        VALUES (gen_uuid, 'the-topic', 'customer-7', 'OrderPlaced', '\\x...', '42');
    COMMIT;

``aggregatetype`` names the topic, ``aggregateid`` is the key, ``payload`` (bytea) the value;
``seq`` is the bench's own column, placed in the ``bench-seq`` header the watcher reads. Rows
stay in the table (Debezium reads the WAL, not the table; deleting them is the application's
business), so nothing here deletes. PostgreSQL only: Debezium needs logical decoding.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import BYTEA, UUID
from sqlalchemy.orm import Session

from bench.connect_worker import SEQ_HEADER
from bench.workload import CUSTOMER_KEYS, PAYLOAD, business_write

EVENT_TYPE = "OrderPlaced"

metadata = sa.MetaData()
outboxevent = sa.Table(
    "outboxevent",
    metadata,
    sa.Column("id", UUID(as_uuid=True), primary_key=True),
    sa.Column("aggregatetype", sa.Text, nullable=False),
    sa.Column("aggregateid", sa.Text, nullable=False),
    sa.Column("type", sa.Text, nullable=False),
    sa.Column("payload", BYTEA),
    sa.Column("seq", sa.Text),
)


def create_outbox_table(engine: sa.Engine) -> None:
    """The outbox table; fails on a database that is not PostgreSQL.

    Raises:
        ValueError: ``engine`` is not PostgreSQL (Debezium's connector needs logical decoding).
    """
    if engine.dialect.name != "postgresql":
        raise ValueError(
            f"baseline C runs on PostgreSQL only, not {engine.dialect.name}: Debezium reads the "
            "WAL through logical decoding; run it with --databases postgresql"
        )
    metadata.create_all(engine)


def event_row(topic: str, customer: int, seq: str | None) -> dict[str, object]:
    return {
        "id": uuid.uuid4(),
        "aggregatetype": topic,
        "aggregateid": CUSTOMER_KEYS[customer].decode(),
        "type": EVENT_TYPE,
        "payload": PAYLOAD,
        "seq": seq,
    }


def place_order_c(
    factory: Callable[[], Session],
    topic: str,
    customer: int,
    messages: int,
    headers: dict[str, str] | None = None,
) -> None:
    """Baseline C: the business write and the outbox rows in one DB transaction."""
    seq = (headers or {}).get(SEQ_HEADER)
    rows = [event_row(topic, customer, seq) for _ in range(messages)]
    with factory() as session, session.begin():
        business_write(session, customer)
        session.execute(outboxevent.insert(), rows)


def preload_outbox(engine: sa.Engine, topic: str, count: int, chunk: int = 5000) -> None:
    """``count`` committed outbox rows (1 KiB each, ``seq`` 0..count-1), for the relay path."""
    for start in range(0, count, chunk):
        rows = [
            event_row(topic, 1 + i % (len(CUSTOMER_KEYS) - 1), str(i))
            for i in range(start, min(start + chunk, count))
        ]
        with engine.begin() as conn:
            conn.execute(outboxevent.insert(), rows)

"""The two alternatives users weigh the outbox against, each written the way a team would.

**Baseline A, "commit, then publish"**: the DB transaction commits, then the messages are sent
with a plain idempotent producer (``acks=all``) and awaited. Fast, and unsafe: a crash or a
Kafka outage after the commit loses the messages, and nothing notices.

**Baseline B, the classic table outbox**: the messages are inserted into an ``outbox_messages``
table in the same DB transaction as the business write; a polling relay moves them to Kafka::

    BEGIN;
    SELECT id, topic, key, value, headers FROM outbox_messages
        ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED;
    -- produce them all (idempotent, acks=all) and wait for the acknowledgements
    DELETE FROM outbox_messages WHERE id = ANY(ids);
    COMMIT;
    -- when the batch was empty: sleep the polling interval (default 100 ms)

Safe (at least once: a crash between the acks and the COMMIT sends a batch twice). SQLite has
no ``SKIP LOCKED``; there the relay takes the write lock up front (``BEGIN IMMEDIATE``), so
several relays take turns. ``python -m bench.baselines relay ...`` runs one relay process.
"""

from __future__ import annotations

import argparse
import json
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Any

import sqlalchemy as sa
from confluent_kafka import KafkaError, Message, Producer
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session

from bench.workload import CUSTOMER_KEYS, PAYLOAD, business_write

DEFAULT_POLL_INTERVAL_S = 0.1
DEFAULT_BATCH = 500
#: (topic, key, value, headers) of one message.
Record = tuple[str, bytes | None, bytes | None, dict[str, str]]

metadata = sa.MetaData()
outbox_messages = sa.Table(
    "outbox_messages",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True),
    sa.Column("topic", sa.Text, nullable=False),
    sa.Column("key", sa.LargeBinary),
    sa.Column("value", sa.LargeBinary),
    sa.Column("headers", sa.JSON().with_variant(JSONB(), "postgresql"), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
)


def create_outbox_table(engine: sa.Engine) -> None:
    metadata.create_all(engine)


def producer_config(bootstrap: str, **extra: Any) -> dict[str, Any]:
    """An idempotent producer with the outbox's own settings (``acks=all``, ``linger.ms=1``)."""
    return {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 1,
        **extra,
    }


class SyncProducer:
    """Baseline A's producer: one per process, shared by threads; ``send`` waits for its own
    acknowledgements only (``flush()`` would wait for every thread's)."""

    def __init__(self, bootstrap: str, **extra: Any) -> None:
        self._producer = Producer(producer_config(bootstrap, **extra))
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="baseline-a-poll", daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.05)

    def send(self, records: Sequence[Record], timeout: float = 30.0) -> None:
        """Produce the records and wait for all their acknowledgements.

        Raises:
            RuntimeError: a record was refused or not acknowledged in time.
        """
        done = threading.Event()
        errors: list[KafkaError] = []
        left = [len(records)]
        lock = threading.Lock()

        def delivered(err: KafkaError | None, msg: Message) -> None:
            with lock:
                if err is not None:
                    errors.append(err)
                left[0] -= 1
                if left[0] == 0:
                    done.set()

        for topic, key, value, headers in records:
            self._producer.produce(
                topic, value=value, key=key, headers=list(headers.items()), on_delivery=delivered
            )
        if not done.wait(timeout) or errors:
            raise RuntimeError(f"baseline A: messages not acknowledged: {errors[:1]}")

    def close(self) -> None:
        self._producer.flush(10)
        self._stop.set()
        self._poller.join()


def records(topic: str, customer: int, messages: int, headers: dict[str, str]) -> list[Record]:
    """The messages of one business transaction: 1 KiB each, keyed by the customer."""
    return [(topic, CUSTOMER_KEYS[customer], PAYLOAD, headers)] * messages


def place_order_a(
    factory: Callable[[], Session],
    producer: SyncProducer,
    topic: str,
    customer: int,
    messages: int,
    headers: dict[str, str] | None = None,
) -> None:
    """Baseline A: commit the business write, then publish (no guarantee in between)."""
    with factory() as session, session.begin():
        business_write(session, customer)
    producer.send(records(topic, customer, messages, headers or {}))


def place_order_b(
    factory: Callable[[], Session],
    topic: str,
    customer: int,
    messages: int,
    headers: dict[str, str] | None = None,
) -> None:
    """Baseline B: the business write and the outbox rows in one DB transaction."""
    rows = [
        {"topic": t, "key": k, "value": v, "headers": h}
        for t, k, v, h in records(topic, customer, messages, headers or {})
    ]
    with factory() as session, session.begin():
        business_write(session, customer)
        session.execute(outbox_messages.insert(), rows)


def preload_outbox(engine: sa.Engine, topic: str, count: int, chunk: int = 5000) -> None:
    """``count`` committed outbox rows (1 KiB each, header ``bench-seq``), for the relay path."""
    for start in range(0, count, chunk):
        rows = [
            {
                "topic": topic,
                "key": CUSTOMER_KEYS[1 + i % (len(CUSTOMER_KEYS) - 1)],
                "value": PAYLOAD,
                "headers": {"bench-seq": str(i)},
            }
            for i in range(start, min(start + chunk, count))
        ]
        with engine.begin() as conn:
            conn.execute(outbox_messages.insert(), rows)


class PollingRelay:
    """Baseline B's relay: one loop, one connection, one idempotent producer; ``run()`` blocks
    until ``close()``."""

    def __init__(
        self,
        db_url: str,
        bootstrap: str,
        *,
        batch: int = DEFAULT_BATCH,
        poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
    ) -> None:
        self.db_url = db_url
        self.batch = batch
        self.poll_interval_s = poll_interval_s
        self.producer = Producer(producer_config(bootstrap, **{"linger.ms": 5}))
        self.sent = 0
        self._closed = threading.Event()

    def close(self) -> None:
        self._closed.set()

    def run(self) -> None:
        url = sa.make_url(self.db_url)
        if url.get_backend_name() == "sqlite":
            self._loop(_sqlite_batches(str(url.database), self.batch))
        else:
            conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
            self._loop(_postgres_batches(conninfo, self.batch))
        self.producer.flush(10)

    def _loop(self, batches: Callable[[], Any]) -> None:
        while not self._closed.is_set():
            rows: list[tuple[Any, ...]] = []
            try:
                with batches() as rows:
                    if rows:
                        self._publish(rows)
            except Exception as err:  # the batch rolled back; its rows are sent again
                print(f"polling relay: {err}; retrying in 1 s", file=sys.stderr, flush=True)
                self._closed.wait(1.0)
                continue
            if not rows:
                self._closed.wait(self.poll_interval_s)

    def _publish(self, rows: list[tuple[Any, ...]]) -> None:
        errors: list[KafkaError] = []

        def delivered(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                errors.append(err)

        for _, topic, key, value, headers in rows:
            if isinstance(headers, str):
                headers = json.loads(headers)
            items: list[tuple[str, str | bytes | None]] = [
                (k, str(v).encode()) for k, v in (headers or {}).items()
            ]
            while True:
                try:
                    self.producer.produce(
                        topic, value=value, key=key, headers=items, on_delivery=delivered
                    )
                    break
                except BufferError:
                    self.producer.poll(0.05)
        if self.producer.flush(30) or errors:
            # The transaction rolls back and the rows are sent again: at least once.
            raise RuntimeError(f"polling relay: batch not acknowledged: {errors[:1]}")
        self.sent += len(rows)


def _postgres_batches(conninfo: str, batch: int) -> Callable[[], Any]:
    import psycopg

    conn = psycopg.connect(conninfo)

    @contextmanager
    def one() -> Iterator[list[tuple[Any, ...]]]:
        with conn.transaction(), conn.cursor() as cur:
            cur.execute(
                "SELECT id, topic, key, value, headers FROM outbox_messages "
                "ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED",
                (batch,),
            )
            rows = cur.fetchall()
            yield rows
            if rows:
                cur.execute(
                    "DELETE FROM outbox_messages WHERE id = ANY(%s)", ([r[0] for r in rows],)
                )

    return one


def _sqlite_batches(path: str, batch: int) -> Callable[[], Any]:
    conn = sqlite3.connect(path, isolation_level=None, timeout=30)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")

    @contextmanager
    def one() -> Iterator[list[tuple[Any, ...]]]:
        conn.execute("BEGIN IMMEDIATE")
        try:
            rows = conn.execute(
                "SELECT id, topic, key, value, headers FROM outbox_messages ORDER BY id LIMIT ?",
                (batch,),
            ).fetchall()
            yield rows
            if rows:
                marks = ",".join("?" * len(rows))
                conn.execute(
                    f"DELETE FROM outbox_messages WHERE id IN ({marks})", [r[0] for r in rows]
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    return one


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.baselines relay --db-url URL --bootstrap HOST:PORT [...]``."""
    parser = argparse.ArgumentParser(prog="python -m bench.baselines")
    parser.add_argument("command", choices=["relay"])
    parser.add_argument("--db-url", required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--batch", type=int, default=DEFAULT_BATCH)
    parser.add_argument("--poll-interval", type=float, default=DEFAULT_POLL_INTERVAL_S)
    args = parser.parse_args(argv)
    relay = PollingRelay(
        args.db_url, args.bootstrap, batch=args.batch, poll_interval_s=args.poll_interval
    )

    def stop(signum: int, frame: FrameType | None) -> None:
        relay.close()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    started = time.monotonic()
    relay.run()
    print(f"polling relay: {relay.sent} sent in {time.monotonic() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

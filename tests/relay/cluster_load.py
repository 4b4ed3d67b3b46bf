"""Load and an independent reader for the three-broker fault test (test_cluster_faults.py).

``OrderLoad`` is producers as users run them: ``producer.transaction`` on PostgreSQL, an order
row and one or two messages per transaction, some declined (rolled back), 2% losing their op
record (a crash right after the database commit) so the checkers have work. Its ground truth is
the orders table itself, read at the end. ``Reader`` is a ``read_committed`` consumer of the
real topic written for this test alone (no relay code), noting when it first saw each value.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, defaultdict
from typing import Any

import sqlalchemy as sa
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import NewTopic
from sqlalchemy.orm import sessionmaker

from outbox import OutboxProducer, OutboxSettings, ensure_topics
from tests.checker.audit.seeded import fresh_database
from tests.checker.test_checker import SECRET
from tests.kafka_helpers import admin_client, read_partition, unique
from tests.producer_fixtures import orders, orders_metadata
from tests.relay.test_relay import read_topic


class Declined(Exception):
    pass


#: Partitions of the real topic.
PARTITIONS = 3


def create_replicated_topic(bootstrap: str, name: str, partitions: int = PARTITIONS) -> None:
    """A topic at the cluster's default replication factor (3) and min ISR (2)."""
    admin = admin_client(bootstrap)
    admin.create_topics([NewTopic(name, partitions, replication_factor=-1)])[name].result(30)


def messages_of(n: int) -> int:
    return 1 + (n % 3 == 0)


class OrderLoad:
    """``threads`` producer threads; each owns its keys, so a key's transactions run one after
    another and their COMMIT ops are written in the order the thread numbered them."""

    def __init__(
        self, bootstrap: str, postgres_url: str, *, threads: int = 3, keys: int = 4
    ) -> None:
        self.db_url = fresh_database(postgres_url)
        self.engine = sa.create_engine(self.db_url, pool_size=threads + 2, pool_pre_ping=True)
        orders_metadata.create_all(self.engine)
        self.session = sessionmaker(self.engine)
        self.settings = OutboxSettings(
            bootstrap_servers=bootstrap,
            producer_group=unique("orders"),
            topic_prefix=unique("__outbox-cluster"),
            partitions=3,
            wait_for_op=True,  # an op the producer saw acknowledged is in the op topic, in order
        )
        ensure_topics(self.settings)
        self.topic = unique("orders")
        create_replicated_topic(bootstrap, self.topic)
        self.producer = OutboxProducer(self.settings)
        self.producer.serve_checks(engine=self.engine, secret=SECRET)
        self.threads, self.keys = threads, keys
        #: order id -> when its transaction began (monotonic): committed after a kill if later
        self.began: dict[str, float] = {}
        #: txn id -> whether the producer's op record was acknowledged (False: lost or dropped)
        self.op_acked: dict[str, bool] = {}
        self.order_of: dict[str, str] = {}  # txn id -> order id
        self.failures: Counter[str] = Counter()
        self._local = threading.local()
        self._send_op = self.producer.kafka.send_op
        self.producer.kafka.send_op = self._op  # type: ignore[method-assign]
        self._stop = threading.Event()
        self._workers = [
            threading.Thread(target=self._run, args=(w,), name=f"load-{w}", daemon=True)
            for w in range(threads)
        ]

    def _op(self, op: Any) -> bool:
        sent = False if getattr(self._local, "drop", False) else self._send_op(op)
        self.op_acked[op.txn_id] = sent
        return sent

    def start(self) -> OrderLoad:
        for worker in self._workers:
            worker.start()
        return self

    def _run(self, worker: int) -> None:
        rng = random.Random(worker)
        n = 0
        while not self._stop.is_set():
            n += 1
            order_id = f"order-{worker}-{n}"
            key = f"customer-{worker}-{n % self.keys}".encode()
            self._local.drop = rng.random() < 0.02
            self.began[order_id] = time.monotonic()
            try:
                with self.producer.transaction(self.session) as txn:
                    self.order_of[txn.txn_id] = order_id
                    txn.session.execute(orders.insert().values(id=order_id, amount=n))
                    for m in range(messages_of(n)):
                        txn.send(self.topic, f"{order_id}/{m}".encode(), key=key)
                    if rng.random() < 0.1:
                        raise Declined
            except Declined:
                pass
            except Exception as err:  # a broker gone mid-transaction: the transaction failed
                self.failures[type(err).__name__] += 1
                time.sleep(0.2)
            time.sleep(0.02)

    def stop(self) -> None:
        """Stop the workers (again: a no-op) once their transactions have ended."""
        self._stop.set()
        for worker in self._workers:
            worker.join(60)
            assert not worker.is_alive(), f"{worker.name} did not stop"

    def close(self) -> None:
        self.producer.close()
        self.engine.dispose()

    def committed(self) -> set[str]:
        """Every value a committed order sent: the ground truth, read from PostgreSQL."""
        with self.engine.connect() as conn:
            ids = conn.execute(sa.select(orders.c.id, orders.c.amount)).all()
        return {f"{order_id}/{m}" for order_id, n in ids for m in range(messages_of(n))}

    def in_order_keys(self) -> set[str]:
        """Orders whose op the producer saw acknowledged: per key, their ops are in the op
        topic in the thread's order, so the relay must deliver them in that order. (A lost op
        is written later by a checker: that order is not the thread's.)"""
        return {self.order_of[t] for t, acked in list(self.op_acked.items()) if acked}


class Reader:
    """A read_committed consumer of ``topic`` in a thread; when it first saw each value."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._first_seen: dict[str, float] = {}
        # Copying a dict another thread is adding to can raise "dictionary changed size during
        # iteration" (a copy that triggers the garbage collector lets the other thread run)
        self._lock = threading.Lock()
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": unique("independent-reader"),
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                # A subscription whose topic the answering broker does not know yet is looked
                # up again only at this interval (5 minutes by default): a reader that joined
                # 0.1 s after the topic's creation, before two brokers had replayed it, was
                # assigned nothing and read nothing for the 180 s the test waits
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        # Kept by the reading thread's rebalance callbacks: the consumer's own assignment()
        # called from another thread blocks while this one is in consume()
        self._assigned: set[int] = set()
        self._consumer.subscribe([topic], on_assign=self._on_assign, on_revoke=self._on_revoke)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reader", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for msg in self._consumer.consume(500, 0.2):
                if msg.error() is None:
                    with self._lock:
                        self._first_seen.setdefault(msg.value().decode(), time.monotonic())
        self._consumer.close()

    def first_seen(self) -> dict[str, float]:
        """Each value read so far, and when it was first read (a copy)."""
        with self._lock:
            return dict(self._first_seen)

    def first_after(self, began: dict[str, float], since: float) -> float | None:
        """When it first saw a record of a transaction that began after ``since``."""
        times = [
            seen
            for value, seen in self.first_seen().items()
            if began.get(value.rsplit("/", 1)[0], 0.0) > since
        ]
        return min(times) if times else None

    def _on_assign(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        with self._lock:
            self._assigned |= {tp.partition for tp in partitions}

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        with self._lock:
            self._assigned -= {tp.partition for tp in partitions}

    def assignment(self) -> list[int]:
        """The partitions its consumer was last assigned (none: its group never gave it any)."""
        with self._lock:
            return sorted(self._assigned)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def final_check(bootstrap: str, load: OrderLoad) -> dict[str, int]:
    """Read the whole topic once more and compare it with the orders table: the counts of
    lost, duplicated and phantom (rolled-back yet delivered) messages, and of keys whose
    producer-decided transactions came out of order."""
    expected = load.committed()
    seen: Counter[str] = Counter()
    per_key: dict[bytes, list[int]] = defaultdict(list)
    ordered = load.in_order_keys()
    for msg in read_topic(bootstrap, load.topic):
        value = msg.value().decode()
        seen[value] += 1
        order_id = value.rsplit("/", 1)[0]
        if order_id in ordered:
            per_key[msg.key()].append(int(order_id.rsplit("-", 1)[1]))
    return {
        "committed": len(expected),
        "lost": len(expected - set(seen)),
        "duplicated": sum(1 for n in seen.values() if n > 1),
        "delivered_after_rollback": len(set(seen) - expected),
        "keys_out_of_order": sum(1 for ns in per_key.values() if ns != sorted(ns)),
    }


def unread(bootstrap: str, load: OrderLoad) -> str:
    """The committed messages a read_committed read of the topic misses now, and which of them
    are in its log all the same (read uncommitted): written in a Kafka transaction not
    committed (yet), rather than never written - late or aborted, not the relay's decision.

    A diagnosis only: should its own reads fail (a partition unreadable for their timeout),
    it says so instead of raising, so the report it goes into still shows."""
    try:
        return _unread(bootstrap, load)
    except Exception as err:  # reported, not handled
        return f"could not tell ({err!r})"


def _unread(bootstrap: str, load: OrderLoad) -> str:
    missing = load.committed() - {m.value().decode() for m in read_topic(bootstrap, load.topic)}
    if not missing:
        return "none"
    in_log = {
        value.decode()
        for p in range(PARTITIONS)
        for value in read_partition(
            bootstrap, load.topic, partition=p, isolation="read_uncommitted"
        )
    }
    return (
        f"{len(missing)}, some: {sorted(missing)[:5]}; of those in the log read uncommitted: "
        f"{len(missing & in_log)}"
    )

"""`make demo`: the orders service, relay, checker and a read_committed consumer, end to end.

Runs on the embedded defaults: a local Kafka broker process and a SQLite file. Some orders are
declined (rolled back), some "crash" right after their DB commit (their op marker is lost), some
are still in progress when first checked. One in ten goes through the RocketMQ-style
``TransactionalProducer`` (``listener.py``), whose local transaction sometimes answers UNKNOWN
and is settled by the listener's ``check_local_transaction``. Exits 0 only when every committed
order was delivered exactly once, no declined order was delivered, and nothing was given up - and
the Spark audit (checker.audit) of what it left on the topics and in its database is clean; it
prints the audit's verdict and the path of its HTML report.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from sqlalchemy.orm import sessionmaker

sys.path.insert(0, str(Path(__file__).resolve().parent))

from listener import OrderRequest, OrdersListener, order_placed
from service import ORDERS_TOPIC, Base, Order, PaymentDeclined, place_order

import outbox
from checker import Checker, CheckerSettings
from outbox import (
    LocalTransactionState,
    OutboxProducer,
    OutboxSettings,
    TransactionalProducer,
    ensure_topics,
    migrations,
)
from outbox.kafka_logging import log_to_python
from outbox.testing import start_kafka
from relay import Relay, RelaySettings

DEMO_SECRET = "demo-only-secret"


class Crashes:
    """Orders whose process 'dies' right after the DB commit: their op marker is never sent."""

    def __init__(self, producer: OutboxProducer) -> None:
        self.local = threading.local()
        self.count = 0
        self._send_op = producer.kafka.send_op
        producer.kafka.send_op = self.send_op  # type: ignore[method-assign]

    def send_op(self, op: Any) -> bool:
        if getattr(self.local, "crash", False):
            self.count += 1
            return False  # lost, as if the process had been killed at this line
        return self._send_op(op)


@dataclass
class Tally:
    placed: int = 0
    declined: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)
    fenced: int = 0
    by_listener: int = 0
    listener_unknown: int = 0
    delivered: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)


def place_all(
    args: argparse.Namespace, tally: Tally, crashes: Crashes, sender: TransactionalProducer
) -> None:
    rng = random.Random(7)
    plan = [
        (i, f"order-{i:05d}", f"customer-{rng.randrange(20)}", rng.random() < args.decline_share)
        for i in range(args.orders)
    ]

    def place(item: tuple[int, str, str, bool]) -> None:
        i, order_id, customer, decline = item
        crashes.local.crash = i % 25 == 7  # 4% crash after their DB commit
        slow = 3.0 if i % 100 == 42 else 0.0  # 1% still in progress at their first check
        try:
            if i % 10 == 3:  # the RocketMQ-style path; every other one answers UNKNOWN
                place_with_listener(
                    sender, order_id, customer, 100 + i, decline, i % 20 == 3, tally
                )
            else:
                place_with_retry(order_id, customer, 100 + i, decline, slow, tally)
        except PaymentDeclined:
            with tally.lock:
                tally.declined.add(order_id)
        except Exception as err:  # not a business outcome: rolled back, and reported below
            with tally.lock:
                tally.failed[order_id] = repr(err)
        with tally.lock:
            tally.placed += 1

    with ThreadPoolExecutor(args.workers) as pool:
        list(pool.map(place, plan))


def place_with_retry(
    order_id: str, customer: str, amount: int, decline: bool, slow: float, tally: Tally
) -> None:
    """A check fenced the transaction (it waited too long for the DB): retry it as a new one."""
    for attempt in range(3):
        try:
            place_order(order_id, customer, amount, decline=decline, payment_seconds=slow)
            return
        except outbox.TransactionFencedError:
            with tally.lock:
                tally.fenced += 1
            if attempt == 2:
                raise


def place_with_listener(
    sender: TransactionalProducer,
    order_id: str,
    customer: str,
    amount: int,
    decline: bool,
    unknown: bool,
    tally: Tally,
) -> None:
    """The order through ``TransactionalProducer``: its listener places it (or declines it)."""
    request = OrderRequest(order_id, customer, amount, decline=decline, answer_unknown=unknown)
    result = sender.send_message_in_transaction(order_placed(request), arg=request)
    with tally.lock:
        tally.by_listener += 1
        tally.listener_unknown += result.local_transaction_state is LocalTransactionState.UNKNOWN
    if result.local_transaction_state is LocalTransactionState.ROLLBACK:
        raise PaymentDeclined(f"payment for {order_id} declined")


def consume(bootstrap: str, tally: Tally, stop: threading.Event) -> None:
    consumer = Consumer(
        log_to_python(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "orders-demo-reader",
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
            }
        )
    )
    consumer.subscribe([ORDERS_TOPIC])
    try:
        while not stop.is_set():
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            order_id = json.loads(msg.value())["order_id"]
            with tally.lock:
                tally.delivered[order_id] += 1
    finally:
        consumer.close()


class Progress:
    """One updating line on a terminal; a line a second in a log."""

    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.last = 0.0

    def show(self, text: str, *, final: bool = False) -> None:
        if self.tty:
            print("\r" + text, end="\n" if final else "", flush=True)
        elif final or time.monotonic() - self.last >= 1.0:
            print(text, flush=True)
            self.last = time.monotonic()


def progress(tally: Tally, total: int, checker: Checker, committed: int | None = None) -> str:
    with tally.lock:
        delivered = sum(tally.delivered.values())
        placed, declined = tally.placed, len(tally.declined)
    resolved = checker.stats.resolved_commit + checker.stats.resolved_rollback
    target = f"/{committed}" if committed is not None else ""
    return (
        f"placed {placed}/{total}  declined {declined}  delivered {delivered}{target}  "
        f"resolved by checker {resolved}"
    )


def committed_ids(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(sa.select(Order.id)).scalars())


def summary(tally: Tally, committed: set[str], checker: Checker) -> dict[str, int]:
    delivered = set(tally.delivered)
    stats = checker.stats
    return {
        "placed": tally.placed,
        "  through TransactionalProducer": tally.by_listener,
        "  of them UNKNOWN, settled by a check": tally.listener_unknown,
        "committed": len(committed),
        "rolled back": len(tally.declined),
        "fenced by a check, retried": tally.fenced,
        "failed (error, rolled back)": len(tally.failed),
        "delivered": len(delivered & committed),
        "missing": len(committed - delivered),
        "duplicated": sum(n - 1 for n in tally.delivered.values() if n > 1),
        "delivered after rollback": len(delivered & (tally.declined | set(tally.failed))),
        "resolved by checker": stats.resolved_commit + stats.resolved_rollback,
        "given up": stats.given_up,
    }


def print_table(rows: dict[str, int]) -> None:
    width = max(len(k) for k in rows)
    print("\n" + "-" * (width + 12))
    for name, value in rows.items():
        print(f"{name:<{width}}  {value:>8}")
    print("-" * (width + 12))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--orders", type=int, default=400)
    parser.add_argument("--decline-share", type=float, default=0.15)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=90.0)
    args = parser.parse_args()
    # Warnings say where they come from (librdkafka's as outbox.librdkafka), as the audit's do.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")

    workdir = Path(tempfile.mkdtemp(prefix="outbox-demo-"))
    print("starting a local Kafka broker ...", flush=True)
    kafka = start_kafka(provider="local")
    try:
        consistent = run(args, kafka.address, workdir)
    finally:
        kafka.stop()
    # The verdict is the last line: every Kafka client was closed before the broker stopped
    # (run), and nothing the broker's shutdown says can come after it.
    print(
        "CONSISTENT: every committed order delivered exactly once, no declined order delivered; "
        "the audit is clean"
        if consistent
        else "INCONSISTENT: see the table and the audit above",
        flush=True,
    )
    return 0 if consistent else 1


def create_real_topic(bootstrap: str, topic: str, *, partitions: int) -> None:
    """The topic the service's events go to: the relay never creates topics by accident."""
    admin = AdminClient(log_to_python({"bootstrap.servers": bootstrap}))
    try:
        admin.create_topics([NewTopic(topic, num_partitions=partitions)])[topic].result(30)
    except KafkaException as err:
        if err.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
    finally:
        admin.poll(0)  # an admin client's librdkafka log comes out only when it is polled


def run(args: argparse.Namespace, bootstrap: str, workdir: Path) -> bool:
    """The demo against ``bootstrap``; True when it was consistent. Every Kafka client it
    started is closed when it returns."""
    db_url = f"sqlite:///{workdir / 'orders.db'}"
    migrations.upgrade(db_url)
    engine = sa.create_engine(db_url, connect_args={"timeout": 30})
    Base.metadata.create_all(engine)
    settings = OutboxSettings(
        bootstrap_servers=bootstrap, producer_group="orders-service", partitions=3
    )
    ensure_topics(settings)
    create_real_topic(bootstrap, ORDERS_TOPIC, partitions=3)
    producer = OutboxProducer(settings)
    outbox.configure(producer=producer, session_factory=sessionmaker(engine))
    sender = TransactionalProducer(producer, OrdersListener(engine))
    # one endpoint answers both: the evidence table for @outbox.transactional orders, the
    # listener's check_local_transaction for the TransactionalProducer ones
    producer.serve_checks(engine=engine, secret=DEMO_SECRET)
    crashes = Crashes(producer)
    print(f"kafka {bootstrap}, database {db_url}")

    relay = Relay(RelaySettings(bootstrap_servers=bootstrap))
    checker = Checker(
        CheckerSettings(
            bootstrap_servers=bootstrap,
            secret=DEMO_SECRET,
            transaction_timeout_s=2,
            check_interval_s=2,
        )
    )
    tally, stop = Tally(), threading.Event()
    threads = [
        threading.Thread(target=relay.run, daemon=True),
        threading.Thread(target=checker.run, daemon=True),
        threading.Thread(target=consume, args=(bootstrap, tally, stop), daemon=True),
    ]
    for thread in threads:
        thread.start()

    placing = threading.Thread(target=place_all, args=(args, tally, crashes, sender))
    placing.start()
    line = Progress()
    while placing.is_alive():
        line.show(progress(tally, args.orders, checker))
        time.sleep(0.25)
    committed = committed_ids(engine)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline and not set(tally.delivered) >= committed:
        line.show(progress(tally, args.orders, checker, len(committed)))
        time.sleep(0.25)
    time.sleep(1.0)  # let any duplicate or phantom show up before judging
    line.show(progress(tally, args.orders, checker, len(committed)), final=True)

    stop.set()
    relay.close()
    checker.close()
    for thread in threads:
        thread.join(30)
    producer.close()

    rows = summary(tally, committed, checker)
    print(f"{crashes.count} orders 'crashed' after their DB commit before their op marker")
    print_table(rows)
    ok = (
        rows["delivered"] == rows["committed"]
        and rows["missing"] == 0
        and rows["duplicated"] == 0
        and rows["delivered after rollback"] == 0
        and rows["given up"] == 0
        and rows["failed (error, rolled back)"] == 0
    )
    for order_id, error in list(tally.failed.items())[:5]:
        print(f"{order_id} failed: {error}")
    audited = audit(bootstrap, db_url, workdir)
    return ok and audited


def audit(bootstrap: str, db_url: str, workdir: Path) -> bool:
    """The Spark audit (checker.audit) of what the demo left on the topics and in the evidence
    table, judged independently of the relay and checker code; True when it is clean."""
    from checker.audit.cli import main as audit_main  # Spark only from here on

    print("\nauditing the topics and the evidence table with Spark ...", flush=True)
    code = audit_main(
        [
            "--bootstrap-servers", bootstrap,
            "--jdbc-url", db_url,
            # the demo checker's timings, so that "stuck" means what it means there
            "--transaction-timeout", "2s",
            "--check-interval", "2s",
            "--grace", "2s",
            "--master", "local[2]",
            "--out", str(workdir / "audit"),
        ]
    )  # fmt: skip
    return code == 0


if __name__ == "__main__":
    sys.exit(main())

"""`make demo`: the orders service, the relay and a read_committed consumer, end to end.

Runs on the embedded defaults: a local Kafka broker process and a SQLite file. Exits 0 only when
every committed order was delivered exactly once and no declined order was delivered.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa
from confluent_kafka import Consumer
from sqlalchemy.orm import sessionmaker

sys.path.insert(0, str(Path(__file__).resolve().parent))

from service import ORDERS_TOPIC, Base, Order, PaymentDeclined, place_order

import outbox
from outbox import OutboxProducer, OutboxSettings, ensure_topics, migrations
from outbox.testing import start_kafka
from relay import Relay, RelaySettings


@dataclass
class Tally:
    placed: int = 0
    declined: set[str] = field(default_factory=set)
    delivered: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)


def place_all(count: int, decline_share: float, tally: Tally, workers: int) -> None:
    rng = random.Random(7)
    plan = [
        (f"order-{i:05d}", f"customer-{rng.randrange(20)}", rng.random() < decline_share)
        for i in range(count)
    ]

    def place(item: tuple[str, str, bool]) -> None:
        order_id, customer, decline = item
        try:
            place_order(order_id, customer, rng.randrange(100, 10_000), decline=decline)
        except PaymentDeclined:
            with tally.lock:
                tally.declined.add(order_id)
        with tally.lock:
            tally.placed += 1

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(place, plan))


def consume(bootstrap: str, tally: Tally, stop: threading.Event) -> None:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "orders-demo-reader",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
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


def progress(tally: Tally, total: int, committed: int | None = None) -> str:
    with tally.lock:
        delivered = sum(tally.delivered.values())
        return (
            f"placed {tally.placed}/{total}  declined {len(tally.declined)}  "
            f"delivered {delivered}" + (f"/{committed}" if committed is not None else "")
        )


def committed_ids(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(sa.select(Order.id)).scalars())


def summary(tally: Tally, committed: set[str]) -> dict[str, int]:
    delivered = set(tally.delivered)
    return {
        "placed": tally.placed,
        "committed": len(committed),
        "rolled back": len(tally.declined),
        "delivered": len(delivered & committed),
        "missing": len(committed - delivered),
        "duplicated": sum(n - 1 for n in tally.delivered.values() if n > 1),
        "delivered after rollback": len(delivered & tally.declined),
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
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="outbox-demo-"))
    print("starting a local Kafka broker ...", flush=True)
    kafka = start_kafka(provider="local")
    try:
        return run(args, kafka.address, workdir)
    finally:
        kafka.stop()


def run(args: argparse.Namespace, bootstrap: str, workdir: Path) -> int:
    db_url = f"sqlite:///{workdir / 'orders.db'}"
    migrations.upgrade(db_url)
    engine = sa.create_engine(db_url, connect_args={"timeout": 30})
    Base.metadata.create_all(engine)
    settings = OutboxSettings(
        bootstrap_servers=bootstrap, producer_group="orders-service", partitions=3
    )
    ensure_topics(settings)
    producer = OutboxProducer(settings)
    outbox.configure(producer=producer, session_factory=sessionmaker(engine))
    print(f"kafka {bootstrap}, database {db_url}")

    relay = Relay(RelaySettings(bootstrap_servers=bootstrap))
    relay_thread = threading.Thread(target=relay.run, name="relay", daemon=True)
    relay_thread.start()
    tally, stop = Tally(), threading.Event()
    reader = threading.Thread(target=consume, args=(bootstrap, tally, stop), daemon=True)
    reader.start()

    placing = threading.Thread(
        target=place_all, args=(args.orders, args.decline_share, tally, args.workers)
    )
    placing.start()
    line = Progress()
    while placing.is_alive():
        line.show(progress(tally, args.orders))
        time.sleep(0.25)
    committed = committed_ids(engine)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline and not set(tally.delivered) >= committed:
        line.show(progress(tally, args.orders, len(committed)))
        time.sleep(0.25)
    time.sleep(1.0)  # let any duplicate or phantom show up before judging
    line.show(progress(tally, args.orders, len(committed)), final=True)

    stop.set()
    relay.close()
    relay_thread.join(30)
    reader.join(10)
    producer.close()

    rows = summary(tally, committed)
    print_table(rows)
    ok = (
        rows["delivered"] == rows["committed"]
        and rows["missing"] == 0
        and rows["duplicated"] == 0
        and rows["delivered after rollback"] == 0
    )
    print(
        "CONSISTENT: every committed order delivered exactly once, no declined order delivered"
        if ok
        else "INCONSISTENT: see the table above"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""A producer process the tests kill with SIGKILL at a chosen moment.

Usage: python crashing_producer.py BOOTSTRAP PREFIX DB_URL TOPIC MOMENT
MOMENT is "after-commit" (DB committed, op not yet sent) or "before-commit" (half sent, DB
transaction open); "serving-after-commit" is "after-commit" in a process that also serves the
group's check endpoint (its registration outlives it until the registry TTL). The process prints
"READY <txn id>" at that moment and waits to be killed.
"""

from __future__ import annotations

import sys
import time

import sqlalchemy as sa
from sqlalchemy.orm import sessionmaker

from outbox import OutboxProducer, OutboxSettings

SECRET = "checker-test-secret"  # tests.checker.test_checker.SECRET (this runs without tests/)


def main() -> None:
    bootstrap, prefix, db_url, topic, moment = sys.argv[1:6]
    settings = OutboxSettings(
        bootstrap_servers=bootstrap, producer_group="orders", topic_prefix=prefix, partitions=3
    )
    producer = OutboxProducer(settings)
    engine = sa.create_engine(db_url)

    def hang(*_: object) -> bool:
        print(f"READY {txn.txn_id}", flush=True)
        time.sleep(600)
        return False

    if moment == "serving-after-commit":
        producer.serve_checks(engine=engine, secret=SECRET)
    if moment.endswith("after-commit"):
        producer.kafka.send_op = hang  # type: ignore[method-assign]
    with producer.transaction(sessionmaker(engine)) as txn:
        txn.send(topic, f"{moment}-{txn.txn_id}", key=txn.txn_id)
        if moment == "before-commit":
            hang()


if __name__ == "__main__":
    main()

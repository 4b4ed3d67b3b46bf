"""A producer instance that serves the group's check endpoint and nothing else, for tests that
run it under another clock (``skewed_clock.c``).

Usage: python skewed_endpoint.py BOOTSTRAP PREFIX DB_URL
Prints "READY <check url> <its clock, Unix s>" once serving, then serves until killed.
"""

from __future__ import annotations

import signal
import sys
import time

import sqlalchemy as sa

from outbox import OutboxProducer, OutboxSettings

SECRET = "checker-test-secret"  # tests.checker.test_checker.SECRET (this runs without tests/)


def main() -> None:
    bootstrap, prefix, db_url = sys.argv[1:4]
    settings = OutboxSettings(
        bootstrap_servers=bootstrap, producer_group="orders", topic_prefix=prefix, partitions=3
    )
    producer = OutboxProducer(settings)
    server = producer.serve_checks(engine=sa.create_engine(db_url), secret=SECRET)
    print(f"READY {server.url} {time.time():.0f}", flush=True)
    signal.pause()


if __name__ == "__main__":
    main()

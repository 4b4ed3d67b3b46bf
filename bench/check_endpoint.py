"""One producer instance serving the check endpoint, as a service process would.

``python -m bench.check_endpoint --bootstrap HOST:PORT --prefix P --group G --db-url URL
--secret S`` creates an :class:`outbox.OutboxProducer`, calls ``serve_checks(engine=...,
secret=...)`` (which announces it in the registry) and serves until SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

from bench.services import engine_for
from outbox import OutboxProducer, OutboxSettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.check_endpoint")
    for name in ("--bootstrap", "--prefix", "--group", "--db-url", "--secret"):
        parser.add_argument(name, required=True)
    args = parser.parse_args(argv)
    settings = OutboxSettings(
        bootstrap_servers=args.bootstrap, producer_group=args.group, topic_prefix=args.prefix
    )
    engine = engine_for(args.db_url, pool_size=8)
    producer = OutboxProducer(settings)
    server = producer.serve_checks(engine=engine, secret=args.secret)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"check endpoint ready at {server.url}", file=sys.stderr, flush=True)
    stop.wait()
    producer.close()
    engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())

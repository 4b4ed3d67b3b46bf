"""The orders service as a long-running process: the example producer of deploy/compose.yaml.

Places an order every ``ORDERS_INTERVAL_S`` seconds (some declined, so rolled back) through
``place_order`` and serves the check endpoint the checker calls. The outbox itself is configured
like every kafka-outbox component, from ``OUTBOX_*`` variables: ``OUTBOX_BOOTSTRAP_SERVERS``,
``OUTBOX_PRODUCER_GROUP``, and for the check endpoint ``OUTBOX_CHECK_SECRET`` (shared with the
checker; required), ``OUTBOX_CHECK_HOST``, ``OUTBOX_CHECK_PORT`` and
``OUTBOX_CHECK_ADVERTISE_URL`` (defaults here: all interfaces, 8081, ``http://<hostname>:8081``).
The application's own settings are ``ORDERS_*``:

- ``ORDERS_DATABASE_URL``: SQLAlchemy URL of the orders database (required);
- ``ORDERS_INTERVAL_S``: time between two orders (default 1).
"""

from __future__ import annotations

import logging
import os
import random
import signal
import socket
import sys
import threading
import uuid
from pathlib import Path
from types import FrameType

import sqlalchemy as sa
from sqlalchemy.orm import sessionmaker

sys.path.insert(0, str(Path(__file__).resolve().parent))

from service import Base, PaymentDeclined, place_order

import outbox
from outbox import OutboxProducer, OutboxSettings, migrations

log = logging.getLogger("orders")


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    database_url = os.environ["ORDERS_DATABASE_URL"]
    # this service's defaults for the check endpoint; OUTBOX_CHECK_* variables win
    port = int(os.environ.get("OUTBOX_CHECK_PORT", "8081"))
    endpoint = {
        "check_host": "0.0.0.0",
        "check_port": port,
        "check_advertise_url": f"http://{socket.gethostname()}:{port}",
    }
    settings = OutboxSettings.from_env(defaults=endpoint)
    interval = float(os.environ.get("ORDERS_INTERVAL_S", "1"))

    migrations.upgrade(database_url)
    engine = sa.create_engine(database_url, pool_pre_ping=True)
    Base.metadata.create_all(engine)
    producer = OutboxProducer(settings)
    outbox.configure(producer=producer, session_factory=sessionmaker(engine))
    producer.serve_checks(engine=engine)  # OUTBOX_CHECK_SECRET, _HOST, _PORT, _ADVERTISE_URL
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    rng = random.Random()
    placed = declined = 0
    while not stop.wait(interval):
        order_id = f"order-{uuid.uuid4().hex[:12]}"
        try:
            place_order(order_id, f"customer-{rng.randrange(20)}", 100, decline=rng.random() < 0.15)
            placed += 1
        except PaymentDeclined:
            declined += 1
        except outbox.OutboxError as err:  # e.g. Kafka unreachable: nothing was committed
            log.warning("order %s not placed: %s", order_id, err)
        if (placed + declined) % 50 == 0:
            log.info("%d orders placed, %d declined (rolled back)", placed, declined)
    producer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

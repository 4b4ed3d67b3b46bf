"""``python -m relay``: run one relay instance with settings from ``OUTBOX_RELAY_*``."""

from __future__ import annotations

import logging
import signal
import sys
from types import FrameType

from outbox.errors import ConfigurationError
from relay.relay import Relay
from relay.settings import RelaySettings


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = RelaySettings.from_env()
    except ConfigurationError as err:
        print(f"relay: {err}", file=sys.stderr)
        return 2
    relay = Relay(settings)

    def stop(signum: int, frame: FrameType | None) -> None:
        relay.close()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    relay.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())

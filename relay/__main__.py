"""``python -m relay``: run one relay instance with settings from ``OUTBOX_RELAY_*``.

SIGTERM and SIGINT finish the open Kafka transaction (within ``shutdown_grace_s``) and exit 0;
exit 2 means the settings are invalid.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

from outbox.errors import ConfigurationError
from outbox.logs import configure_logging
from relay.relay import Relay
from relay.settings import RelaySettings


def run(settings: RelaySettings) -> int:
    """Run a relay until SIGTERM/SIGINT; the console script's ``relay`` command calls this."""
    configure_logging(settings.log_format)
    relay = Relay(settings)

    def stop(signum: int, frame: FrameType | None) -> None:
        relay.close()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    relay.run()
    return 0


def main() -> int:
    try:
        settings = RelaySettings.from_env()
    except ConfigurationError as err:
        print(f"relay: {err}", file=sys.stderr)
        return 2
    return run(settings)


if __name__ == "__main__":
    sys.exit(main())

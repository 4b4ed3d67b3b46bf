"""``python -m checker``: run one checker instance with settings from ``OUTBOX_CHECKER_*``."""

from __future__ import annotations

import logging
import signal
import sys
from types import FrameType

from checker.checker import Checker
from checker.metrics import serve_metrics
from checker.settings import CheckerSettings
from outbox.errors import ConfigurationError


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = CheckerSettings.from_env()
    except ConfigurationError as err:
        print(f"checker: {err}", file=sys.stderr)
        return 2
    checker = Checker(settings)
    if settings.metrics_port:
        serve_metrics(checker, settings.metrics_port)

    def stop(signum: int, frame: FrameType | None) -> None:
        checker.close()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    checker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())

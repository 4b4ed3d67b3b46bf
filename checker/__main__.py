"""``python -m checker``: run one checker instance with settings from ``OUTBOX_CHECKER_*``.

SIGTERM and SIGINT stop it (exit 0); exit 2 means the settings are invalid, or librdkafka or the
brokers refuse one (:mod:`outbox.refused_settings`); exit 3 means the loop was stuck for
``stuck_exit_s`` (a Kafka client call that never returned) and the process gave up so that its
supervisor starts a fresh one (:mod:`outbox.watchdog`). SIGUSR1 writes every thread's stack to
stderr (it goes on running).
"""

from __future__ import annotations

import faulthandler
import signal
import sys
from types import FrameType

from checker.checker import Checker
from checker.metrics import serve
from checker.settings import CheckerSettings
from outbox.errors import ConfigurationError
from outbox.logs import configure_logging
from outbox.watchdog import watch


def run(settings: CheckerSettings) -> int:
    """Run a checker until SIGTERM/SIGINT; the console script's ``checker`` command calls this."""
    configure_logging(settings.log_format)
    checker = Checker(settings)
    endpoint = (
        serve(checker, settings.http_port, settings.http_host) if settings.http_port else None
    )

    def stop(signum: int, frame: FrameType | None) -> None:
        checker.close()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # stacks to stderr
    if settings.stuck_limit_s:
        watch(checker, settings.stuck_limit_s, name="checker")
    try:
        checker.run()
    finally:
        checker.close()  # also when it raised: its watchdog stops watching
        if endpoint is not None:
            endpoint.close()
    return 0


def main() -> int:
    try:
        settings = CheckerSettings.from_env()
        return run(settings)
    except ConfigurationError as err:  # invalid, or refused by librdkafka or the brokers later
        print(f"checker: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""``python -m relay``: run one relay instance with settings from ``OUTBOX_RELAY_*``.

SIGTERM and SIGINT finish the open Kafka transaction (within ``shutdown_grace_s``) and exit 0;
exit 2 means the settings are invalid, or librdkafka or the brokers refuse one
(:mod:`outbox.refused_settings`); exit 3 means the loop was stuck for ``stuck_exit_s`` (a Kafka
client call that never returned) and the process gave up so that its supervisor starts a fresh
one - the broker aborts the open Kafka transaction and the next process redoes it. SIGUSR1
writes every thread's stack to stderr (for a relay that looks stuck; it goes on running).
"""

from __future__ import annotations

import faulthandler
import gc
import logging
import signal
import sys
from types import FrameType

from outbox.errors import ConfigurationError
from outbox.logs import configure_logging
from outbox.watchdog import EXIT_STUCK, watch
from relay.relay import Relay
from relay.settings import RelaySettings

__all__ = ["EXIT_STUCK", "GC_THRESHOLDS", "main", "run", "watch"]


#: The relay process's cyclic-garbage-collector thresholds (CPython's are 700, 10, 10).
#: The relay allocates a few short-lived objects per record and keeps a large, long-lived
#: state (held records, the decisions it remembers); with CPython's thresholds the collector
#: walked that state in a full collection every ~4,500 transactions and found next to nothing
#: to free: 1.2-1.8 s of 5.6-7.1 s of the process's CPU for 100,000 one-message promotions.
#: With these it spends ~0.2 s (docs/benchmarks.md, "Where the relay's time goes"); it still
#: runs, so reference cycles are still freed.
GC_THRESHOLDS = (50_000, 50, 50)

log = logging.getLogger("relay")


def run(settings: RelaySettings) -> int:
    """Run a relay until SIGTERM/SIGINT; the console script's ``relay`` command calls this."""
    configure_logging(settings.log_format)
    gc.set_threshold(*GC_THRESHOLDS)
    relay = Relay(settings)

    def stop(signum: int, frame: FrameType | None) -> None:
        relay.close()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    if settings.stuck_exit_s:
        watch(relay, settings.stuck_exit_s, name="relay")
    try:
        relay.run()
    finally:
        relay.close()  # also when it raised: its watchdog stops watching
    return 0


def main() -> int:
    try:
        settings = RelaySettings.from_env()
        return run(settings)
    except ConfigurationError as err:  # invalid, or refused by librdkafka or the brokers later
        print(f"relay: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

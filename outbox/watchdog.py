"""Ending a service process whose loop stopped turning, so that its supervisor starts a fresh one.

librdkafka can hang in a call that never returns, whatever timeout it was given: a
transactional producer's ``send_offsets_to_transaction`` once a broker restart left it needing an
epoch bump (cf. confluentinc/librdkafka#3013) - seen in the relay and in the checker under the
three-broker fault test. A thread cannot interrupt a C call, and a new session in the same process
would share state with the stuck one; a fresh process is the clean way out. Its correctness is a
SIGKILL's: the broker aborts the Kafka transaction it had open, and the committed offsets say
where the next process starts. A stuck consumer also stays in its group, holding its partitions
and blocking the others' rebalance until ``max.poll.interval.ms`` (5 minutes by default), so a
stuck relay or checker stalls its peers too. The relay (``python -m relay``) and the checker
(``python -m checker``) both run this watchdog.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import threading
from collections.abc import Callable
from typing import Protocol

#: Exit code of a service whose loop was stuck.
EXIT_STUCK = 3


class Watched(Protocol):
    """A service loop: closed when it stops on purpose; how long since it last turned."""

    @property
    def closed(self) -> threading.Event: ...

    def idle_s(self) -> float: ...


def watch(
    service: Watched,
    limit_s: float,
    every_s: float = 5.0,
    *,
    name: str,
    exit: Callable[[int], object] = os._exit,
) -> threading.Thread:
    """Exit the process (code :data:`EXIT_STUCK`, every thread's stack written to stderr first)
    when ``service``'s loop (``name``: ``relay``, ``checker``; its logger too) has not turned for
    ``limit_s``; checked every ``every_s`` until the service is closed. ``exit`` is
    :func:`os._exit` (no clean-up: a stuck thread could block one)."""
    log = logging.getLogger(name)

    def check() -> None:
        while not service.closed.wait(every_s):
            idle = service.idle_s()
            if idle > limit_s:
                log.critical(
                    "the %s loop has not turned for %.0f s (a Kafka client call does not "
                    "return); exiting with code %d so that a fresh process takes over - "
                    "stacks follow",
                    name,
                    idle,
                    EXIT_STUCK,
                )
                faulthandler.dump_traceback(all_threads=True)
                exit(EXIT_STUCK)
                return  # os._exit does not return; another exit (a test's) ends the watch

    thread = threading.Thread(target=check, name=f"{name}-watchdog", daemon=True)
    thread.start()
    return thread

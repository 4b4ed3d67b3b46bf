"""What a service's ``/healthz`` and ``/readyz`` answer: whether its loop turns, and whether it
is ready (the relay: holding partition pairs, or a standby, with nothing refused by Kafka:
``relay.readiness``; the checker: every assigned partition read to its end).

Written by the loop's thread, read by the HTTP thread: plain attributes, each replaced whole.
"""

from __future__ import annotations

import time


class Health:
    """Liveness (when the loop last turned) and readiness (and why not)."""

    def __init__(self, loop: str) -> None:
        self.loop = loop
        self._loop_at = time.monotonic()
        self._ready = (False, "starting")

    def touch(self) -> None:
        """The loop turned, or a session start or rebuild step moved on."""
        self._loop_at = time.monotonic()

    def idle_s(self) -> float:
        """Seconds since the loop last turned (or a session start or rebuild step moved on)."""
        return time.monotonic() - self._loop_at

    def live(self, timeout_s: float) -> tuple[bool, str]:
        idle = self.idle_s()
        if idle > timeout_s:
            return False, f"the {self.loop} loop has not turned for {idle:.0f} s"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        return self._ready

    def set_ready(self, ready: bool, why: str) -> None:
        self._ready = (ready, why)

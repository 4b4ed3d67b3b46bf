"""A monotonic clock a test moves by hand (``clock.now += 60``), passed where code takes a
``clock`` or ``monotonic`` callable."""

from __future__ import annotations


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

"""A circuit breaker per producer group: a storm of UNKNOWN answers or endpoint errors pauses
that group's checks instead of feeding the storm."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class Breaker:
    """Opens when ``threshold`` of the last ``window`` outcomes were bad (at least ``min_samples``).

    While open (``cooldown_s``), the group is not checked; its transactions stay due and lose no
    check attempt. It then closes with a clean window.
    """

    window: int = 50
    min_samples: int = 20
    threshold: float = 0.8
    cooldown_s: float = 30.0
    outcomes: deque[bool] = field(default_factory=deque)
    open_until: float = 0.0
    trips: int = 0

    def allows(self, now: float) -> bool:
        return now >= self.open_until

    def record(self, bad: bool, now: float) -> bool:
        """Record one outcome; True when this outcome tripped the breaker."""
        self.outcomes.append(bad)
        while len(self.outcomes) > self.window:
            self.outcomes.popleft()
        if len(self.outcomes) < self.min_samples:
            return False
        if sum(self.outcomes) / len(self.outcomes) < self.threshold:
            return False
        self.open_until = now + self.cooldown_s
        self.outcomes.clear()
        self.trips += 1
        return True

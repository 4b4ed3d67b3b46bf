"""How fast this machine runs Python right now: a fixed interpreter workload, timed between
scenarios.

On a shared VM one core's speed moves by tens of percent within an hour (docs/benchmarks.md,
"Noise"), so a figure compared with another run's says as much about the host as about the
code. The relay is one Python thread, so its promotions/s move with this figure; reading both
together tells a slower host from slower code. The workload uses nothing of the project, so the
figure compares across commits too. It runs while no scenario does: it measures the host, not
the benchmark's own load.
"""

from __future__ import annotations

import statistics
import time

#: Loop steps per timed repeat: ~0.1 s on a 2-core VM of 2026.
STEPS = 200_000


def _workload(steps: int) -> int:
    """Dict, str and int work, as a record decoder does."""
    seen: dict[str, int] = {}
    total = 0
    for i in range(steps):
        key = str(i)
        seen[key] = i
        total += int(key) + len(key)
    return total + len(seen)


def python_speed(steps: int = STEPS, repeats: int = 5) -> float:
    """Million loop steps per second: the median of ``repeats`` timings (wall clock, so time the
    host gives to other guests counts as slowness, as it does for the scenarios)."""
    timings = []
    for _ in range(repeats):
        began = time.perf_counter()
        _workload(steps)
        timings.append(time.perf_counter() - began)
    return steps / statistics.median(timings) / 1e6

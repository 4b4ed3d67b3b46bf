"""Quarter-decade latency bins (ms): 0 is [0, 1 ms), bin k is [10^((k-1)/4), 10^(k/4)) ms.

Milliseconds and minutes fit on one chart. Shared by the Spark side (which counts) and the
report side (which draws and labels), without importing Spark.
"""

from __future__ import annotations

#: Bins per power of ten.
BINS_PER_DECADE = 4


def bin_edges_ms(index: int) -> tuple[float, float]:
    """[low, high) of bin ``index`` in ms."""
    if index == 0:
        return (0.0, 1.0)
    return (10 ** ((index - 1) / BINS_PER_DECADE), 10 ** (index / BINS_PER_DECADE))


def bin_index(ms: float) -> int:
    """The bin of a latency (what :func:`checker.audit.stats.bin_of` computes in Spark)."""
    import math

    if ms < 1:
        return 0
    return math.floor(math.log10(ms) * BINS_PER_DECADE) + 1


def bins_span(pairs: list[tuple[int, int]]) -> range:
    """Every bin from the first to the last non-empty one (empty ones shown as gaps)."""
    if not pairs:
        return range(0)
    return range(pairs[0][0], pairs[-1][0] + 1)


def label_ms(ms: float) -> str:
    """A short label for a duration in ms: 250ms, 1.8s, 3.2min, 2h."""
    if ms < 1000:
        return f"{ms:.3g}ms"
    if ms < 60_000:
        return f"{ms / 1000:.3g}s"
    if ms < 3_600_000:
        return f"{ms / 60_000:.3g}min"
    return f"{ms / 3_600_000:.3g}h"

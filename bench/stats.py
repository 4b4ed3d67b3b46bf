"""Small statistics: the median and spread of repeated runs, percentiles of latencies.

Standard library only. Percentiles interpolate linearly between the two nearest ranks (what
numpy's default does), so p99 of 100 samples is not simply the largest but one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``; NaN when there are none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return _interpolate(ordered, q)


def percentiles(values: Iterable[float], qs: Sequence[float]) -> list[float]:
    """Several percentiles of the same values, sorting once."""
    ordered = sorted(values)
    return [_interpolate(ordered, q) if ordered else math.nan for q in qs]


def _interpolate(ordered: Sequence[float], q: float) -> float:
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is not within 0-100")
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class Summary:
    """One metric over repeated runs: every run's value, the median and the spread.

    The spread is given two ways: the whole range (min-max), and the interquartile range
    (q1-q3), which one outlying run does not move.
    """

    unit: str
    runs: tuple[float, ...]
    median: float
    min: float
    max: float
    q1: float
    q3: float

    @classmethod
    def of(cls, values: Sequence[float], unit: str) -> Summary:
        finite = [v for v in values if not math.isnan(v)]
        if not finite:
            nan = math.nan
            return cls(unit, tuple(values), nan, nan, nan, nan, nan)
        q1, median, q3 = percentiles(finite, (25, 50, 75))
        return cls(unit, tuple(values), median, min(finite), max(finite), q1, q3)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Summary:
        def num(value: float | None) -> float:
            return math.nan if value is None else float(value)

        return cls(
            data["unit"],
            tuple(num(v) for v in data["runs"]),
            num(data["median"]),
            num(data["min"]),
            num(data["max"]),
            num(data["q1"]),
            num(data["q3"]),
        )

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    def spread(self) -> str:
        """``min-max`` as text, with the unit's precision."""
        if len(self.runs) < 2:
            return "1 run"
        return f"{fmt(self.min, self.unit)}-{fmt(self.max, self.unit)}"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["runs"] = [_clean(v) for v in self.runs]
        data["iqr"] = self.iqr
        return {k: _clean(v) if isinstance(v, float) else v for k, v in data.items()}


def _clean(value: float) -> float | None:
    """JSON has no NaN: a metric that could not be measured is null."""
    return None if math.isnan(value) else round(value, 4)


def fmt(value: float | None, unit: str = "") -> str:
    """A number the way a table shows it: thousands separators, few decimals."""
    if value is None or math.isnan(value):
        return "n/a"
    if unit in ("ms", "s"):
        return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"
    if unit == "count":
        return f"{value:,.0f}"
    if unit in ("ratio", "x"):
        return f"{value:.2f}"
    if unit == "%":
        return f"{value:.0f}%"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:,.1f}"

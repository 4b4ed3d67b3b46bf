"""One speed target and the two ways it is measured: a figure against a bound, or the ratio of
ours to a baseline run beside it (:mod:`bench.targets` lists the targets themselves)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.model import Row, ScenarioResult
from bench.stats import Summary, fmt


@dataclass
class Target:
    """One target: what it asks, what was measured (median and spread), and whether it is met."""

    name: str
    goal: str
    measured: str = "not measured"
    spread: str = ""
    met: bool | None = None
    value: float | None = None
    note: str = ""

    def verdict(self) -> str:
        """The table's "met" column: yes, NO, or n/a when not measured in this run."""
        return {True: "yes", False: "NO", None: "n/a"}[self.met]

    def to_json(self) -> dict[str, Any]:
        """As the results file stores it (NaN as null: JSON has no NaN)."""
        return {
            "name": self.name,
            "goal": self.goal,
            "measured": self.measured,
            "value": None if self.value is None or math.isnan(self.value) else self.value,
            "spread": self.spread,
            "met": self.met,
            "note": self.note,
        }


Results = dict[str, ScenarioResult]


def row_of(results: Results, scenario: str, **config: Any) -> Row | None:
    """The row of ``scenario`` with this configuration, if the run measured it."""
    found = results.get(scenario)
    return None if found is None else found.find(**config)


def metric_of(row: Row | None, metric: str) -> Summary | None:
    """A row's figures for ``metric``; None where not measured (no row, or every run NaN)."""
    if row is None or metric not in row.metrics:
        return None
    summary = row.metrics[metric]
    return None if math.isnan(summary.median) else summary


def absolute(target: Target, summary: Summary | None, ok: Callable[[float], bool]) -> Target:
    """``target`` measured against a bound: its median, met where ``ok`` says so."""
    if summary is not None:
        target.value = summary.median
        target.measured = f"{fmt(summary.median, summary.unit)} {summary.unit}"
        target.spread = summary.spread()
        target.met = ok(summary.median)
    return target


def ratio(
    target: Target,
    top: Summary | None,
    bottom: Summary | None,
    ok: Callable[[float], bool],
    *,
    paired: bool = False,
) -> Target:
    """``top / bottom`` of the medians. The spread is top's min-max over bottom's median, or,
    when the two were measured in interleaved rounds (``paired``: run i of each in round i),
    the min-max of the rounds' own ratios, which a slow spell of the host moves far less."""
    if top is not None and bottom is not None and bottom.median > 0:
        value = top.median / bottom.median
        target.value = value
        target.measured = (
            f"{value:.2f}x ({fmt(top.median, top.unit)} / {fmt(bottom.median, bottom.unit)})"
        )
        rounds = round_ratios(top, bottom) if paired else []
        if rounds:
            target.spread = f"{min(rounds):.2f}-{max(rounds):.2f}x by round"
        elif len(top.runs) > 1:
            target.spread = f"{top.min / bottom.median:.2f}-{top.max / bottom.median:.2f}x"
        else:
            target.spread = "1 run"
        target.met = ok(value)
    return target


def round_ratios(top: Summary, bottom: Summary) -> list[float]:
    """Each round's ``top / bottom``, when both have every round's figure (else none)."""
    if len(top.runs) != len(bottom.runs) or len(top.runs) < 2:
        return []
    pairs = list(zip(top.runs, bottom.runs, strict=True))
    if not all(math.isfinite(t) and math.isfinite(b) and b > 0 for t, b in pairs):
        return []
    return [t / b for t, b in pairs]


def interleaved(*rows: Row | None) -> bool:
    """Whether every row's runs were interleaved with the others' (``bench.model.
    repeat_interleaved``; results before it ran each impl's runs one after another)."""
    return all(row is not None and row.info.get("interleaved") is True for row in rows)

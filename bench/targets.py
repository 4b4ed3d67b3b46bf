"""Issue 8's targets, each computed from what this run measured; never hard-coded.

A target whose figures were not measured in this run (a scenario skipped, a smaller audit in a
quick run) says so instead of passing or failing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.model import Row, ScenarioResult
from bench.stats import Summary, fmt

AUDIT_TARGET_TXNS = 1_000_000


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
        return {True: "yes", False: "NO", None: "n/a"}[self.met]

    def to_json(self) -> dict[str, Any]:
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


def _row(results: Results, scenario: str, **config: Any) -> Row | None:
    found = results.get(scenario)
    return None if found is None else found.find(**config)


def _metric(row: Row | None, metric: str) -> Summary | None:
    if row is None or metric not in row.metrics:
        return None
    summary = row.metrics[metric]
    return None if math.isnan(summary.median) else summary


def _absolute(target: Target, summary: Summary | None, ok: Callable[[float], bool]) -> Target:
    if summary is not None:
        target.value = summary.median
        target.measured = f"{fmt(summary.median, summary.unit)} {summary.unit}"
        target.spread = summary.spread()
        target.met = ok(summary.median)
    return target


def _ratio(
    target: Target, top: Summary | None, bottom: Summary | None, ok: Callable[[float], bool]
) -> Target:
    """``top / bottom`` of the medians; the spread is top's min-max over bottom's median."""
    if top is not None and bottom is not None and bottom.median > 0:
        ratio = top.median / bottom.median
        target.value = ratio
        target.measured = (
            f"{ratio:.2f}x ({fmt(top.median, top.unit)} / {fmt(bottom.median, bottom.unit)})"
        )
        if len(top.runs) > 1:
            target.spread = f"{top.min / bottom.median:.2f}-{top.max / bottom.median:.2f}x"
        else:
            target.spread = "1 run"
        target.met = ok(ratio)
    return target


def evaluate(results: Results) -> list[Target]:
    """Every target of issue 8 against this run's figures."""
    pg = "postgresql"
    ours16 = _row(results, "producer", impl="ours", db=pg, workers=16, messages=1)
    a16 = _row(results, "producer", impl="baseline_a", db=pg, workers=16, messages=1)
    ours_async16 = _row(results, "producer_async", impl="ours", db=pg, tasks=16)
    a_async16 = _row(results, "producer_async", impl="baseline_a", db=pg, tasks=16)
    pgbench16 = _row(results, "ceilings", tool="pgbench", clients=16)
    relay1 = _row(results, "relay", impl="ours", relays=1)
    relay2 = _row(results, "relay", impl="ours", relays=2)
    e2e_ours = _row(results, "end_to_end", impl="ours", db=pg, offered_per_s=1000)
    e2e_b = _row(results, "end_to_end", impl="baseline_b", db=pg, offered_per_s=1000)
    checker = _row(results, "checker", db=pg)
    audit = next(iter(results["audit"].rows), None) if "audit" in results else None

    targets = [
        _absolute(
            Target(
                "producer throughput", "producer, 16 workers, PostgreSQL, 1 msg/txn: >= 2,500 txn/s"
            ),
            _metric(ours16, "txn_per_s"),
            lambda v: v >= 2500,
        ),
        _ratio(
            Target("producer vs pgbench", "the same, >= 45% of pgbench's 16-client ceiling"),
            _metric(ours16, "txn_per_s"),
            _metric(pgbench16, "per_s"),
            lambda r: r >= 0.45,
        ),
        _ratio(
            Target("producer p50 vs A", "the same, p50 latency <= 1.5x baseline A's p50"),
            _metric(ours16, "p50_ms"),
            _metric(a16, "p50_ms"),
            lambda r: r <= 1.5,
        ),
        _ratio(
            Target(
                "asyncio producer vs A",
                "asyncio, 16 tasks, PostgreSQL: >= 0.9x async baseline A's txn/s (issue 29)",
            ),
            _metric(ours_async16, "txn_per_s"),
            _metric(a_async16, "txn_per_s"),
            lambda r: r >= 0.9,
        ),
        _absolute(
            Target("one relay", "one relay: >= 20,000 promotions/s"),
            _metric(relay1, "promotions_per_s"),
            lambda v: v >= 20_000,
        ),
        _ratio(
            Target("two relays", "two relays: >= 1.6x one relay"),
            _metric(relay2, "promotions_per_s"),
            _metric(relay1, "promotions_per_s"),
            lambda r: r >= 1.6,
        ),
        _absolute(
            Target("end to end p99", "end to end at 1,000 txn/s, PostgreSQL: p99 <= 100 ms"),
            _metric(e2e_ours, "p99_ms"),
            lambda v: v <= 100,
        ),
        _ratio(
            Target("end to end vs B", "the same p99 lower than baseline B's (100 ms polling)"),
            _metric(e2e_ours, "p99_ms"),
            _metric(e2e_b, "p99_ms"),
            lambda r: r < 1,
        ),
        _absolute(
            Target("checker", "checker, PostgreSQL: >= 2,000 resolutions/s"),
            _metric(checker, "resolutions_per_s"),
            lambda v: v >= 2000,
        ),
        _absolute(
            Target("audit", "audit of 1,000,000 transactions on local[2]: <= 120 s"),
            _metric(audit, "audit_s"),
            lambda v: v <= 120,
        ),
    ]
    _annotate(targets, e2e_ours, e2e_b, audit)
    return targets


def _annotate(
    targets: list[Target], e2e_ours: Row | None, e2e_b: Row | None, audit: Row | None
) -> None:
    by_name = {t.name: t for t in targets}
    ours, b = _metric(e2e_ours, "achieved_per_s"), _metric(e2e_b, "achieved_per_s")
    if ours is not None:
        by_name["end to end p99"].note = f"achieved {fmt(ours.median)} of 1,000 txn/s offered"
        if b is not None:
            by_name[
                "end to end vs B"
            ].note = f"achieved: ours {fmt(ours.median)}, B {fmt(b.median)} of 1,000 txn/s offered"
    if audit is not None and audit.config.get("transactions") != AUDIT_TARGET_TXNS:
        target = by_name["audit"]
        target.note = f"measured on {audit.config['transactions']:,} transactions, not 1,000,000"
        target.met = None

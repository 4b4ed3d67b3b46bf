"""The speed targets (issue 30's, with issue 29's asyncio one and two of issue 8), each computed
from what this run measured; never hard-coded.

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
        ratio = top.median / bottom.median
        target.value = ratio
        target.measured = (
            f"{ratio:.2f}x ({fmt(top.median, top.unit)} / {fmt(bottom.median, bottom.unit)})"
        )
        rounds = _round_ratios(top, bottom) if paired else []
        if rounds:
            target.spread = f"{min(rounds):.2f}-{max(rounds):.2f}x by round"
        elif len(top.runs) > 1:
            target.spread = f"{top.min / bottom.median:.2f}-{top.max / bottom.median:.2f}x"
        else:
            target.spread = "1 run"
        target.met = ok(ratio)
    return target


def _round_ratios(top: Summary, bottom: Summary) -> list[float]:
    """Each round's ``top / bottom``, when both have every round's figure (else none)."""
    pairs = list(zip(top.runs, bottom.runs, strict=False))
    if len(top.runs) != len(bottom.runs) or len(pairs) < 2:
        return []
    if not all(math.isfinite(t) and math.isfinite(b) and b > 0 for t, b in pairs):
        return []
    return [t / b for t, b in pairs]


def _interleaved(*rows: Row | None) -> bool:
    """Whether every row's runs were interleaved with the others' (``bench.model.
    repeat_interleaved``; results before it ran each impl's runs one after another)."""
    return all(row is not None and row.info.get("interleaved") is True for row in rows)


def evaluate(results: Results) -> list[Target]:
    """The speed targets of issue 30 (and the asyncio one of issue 29, the checker's and two
    relays' of issue 8) against this run's figures: ratios to a baseline run beside ours."""
    targets = [*_producer(results), *_relay(results), *_end_to_end(results)]
    checker = _row(results, "checker", db="postgresql")
    targets.append(
        _absolute(
            Target("checker", "checker, PostgreSQL: >= 2,000 resolutions/s"),
            _metric(checker, "resolutions_per_s"),
            lambda v: v >= 2000,
        )
    )
    audit = next(iter(results["audit"].rows), None) if "audit" in results else None
    target = _absolute(
        Target("audit", "audit of 1,000,000 transactions on local[2]: <= 70 s"),
        _metric(audit, "audit_s"),
        lambda v: v <= 70,
    )
    if audit is not None and audit.config.get("transactions") != AUDIT_TARGET_TXNS:
        target.note = f"measured on {audit.config['transactions']:,} transactions, not 1,000,000"
        target.met = None
    targets.append(target)
    return targets


def _producer(results: Results) -> list[Target]:
    dbs = (("postgresql", "PostgreSQL"), ("sqlite", "SQLite"))
    targets = [
        _vs_a(results, db, name, workers, metric, goal, ok)
        for workers, metric, goal, ok in (
            (16, "txn_per_s", ">= 0.9x baseline A's txn/s", lambda r: r >= 0.9),
            (1, "p50_ms", "p50 <= 1.0x baseline A's p50", lambda r: r <= 1.0),
        )
        for db, name in dbs
    ]

    def async_row(impl: str) -> Row | None:
        return _row(results, "producer_async", impl=impl, db="postgresql", tasks=16)

    def async_rate(impl: str) -> Summary | None:
        return _metric(async_row(impl), "txn_per_s")

    target = _ratio(
        Target(
            "asyncio producer vs A",
            "asyncio, 16 tasks, PostgreSQL: >= 0.9x async baseline A's txn/s (issue 29)",
        ),
        async_rate("ours"),
        async_rate("baseline_a"),
        lambda r: r >= 0.9,
        paired=_interleaved(async_row("ours"), async_row("baseline_a")),
    )
    target.note = _floor_note(async_rate("protocol_floor"), async_rate("baseline_a"))
    targets.append(target)
    return targets


def _vs_a(
    results: Results,
    db: str,
    name: str,
    workers: int,
    metric: str,
    goal: str,
    ok: Callable[[float], bool],
) -> Target:
    """Ours against baseline A on the producer path, one message per transaction."""
    label = "producer vs A" if workers > 1 else "producer p50 vs A"
    ours = _row(results, "producer", impl="ours", db=db, workers=workers, messages=1)
    a = _row(results, "producer", impl="baseline_a", db=db, workers=workers, messages=1)
    floor = _row(results, "producer", impl="protocol_floor", db=db, workers=workers, messages=1)
    plural = "s" if workers > 1 else ""
    target = _ratio(
        Target(f"{label}, {name}", f"{workers} worker{plural}, {name}, 1 msg/txn: {goal}"),
        _metric(ours, metric),
        _metric(a, metric),
        ok,
        paired=_interleaved(ours, a),
    )
    target.note = _floor_note(_metric(floor, metric), _metric(a, metric))
    return target


def _floor_note(floor: Summary | None, a: Summary | None) -> str:
    """What A plus the protocol's two records (:mod:`bench.floor`) measured beside them: how
    far A's serial shape falls with those records added, before any of ours' machinery."""
    if floor is None or a is None or a.median <= 0:
        return ""
    return f"protocol floor (A + evidence row + op record): {floor.median / a.median:.2f}x A"


def _relay_floor_note(python: Summary | None, jvm: Summary | None, b: Summary | None) -> str:
    """What the Kafka work alone of a relay of this protocol (:mod:`bench.relay_floor`) measured
    beside B: how close to B any relay in Python on confluent-kafka can come, and one that makes
    no Python object per record (Kafka's Java client)."""
    if b is None or b.median <= 0:
        return ""
    parts = [
        f"{floor.median / b.median:.2f}x B {where}"
        for floor, where in ((python, "in Python"), (jvm, "on the JVM"))
        if floor is not None
    ]
    return f"protocol floor (the relay's Kafka work alone): {', '.join(parts)}" if parts else ""


def _relay(results: Results) -> list[Target]:
    relay1 = _row(results, "relay", impl="ours", relays=1)
    relay2 = _row(results, "relay", impl="ours", relays=2)
    b1 = _row(results, "relay", impl="baseline_b", db="postgresql", relays=1)
    floor = _row(results, "relay", impl="protocol_floor", relays=1)
    jvm = _row(results, "relay", impl="protocol_floor_jvm", relays=1)
    one = _ratio(
        Target("one relay vs B", "one relay: >= 1.3x baseline B's polling relay (PostgreSQL)"),
        _metric(relay1, "promotions_per_s"),
        _metric(b1, "promotions_per_s"),
        lambda r: r >= 1.3,
    )
    one.note = _relay_floor_note(
        _metric(floor, "promotions_per_s"),
        _metric(jvm, "promotions_per_s"),
        _metric(b1, "promotions_per_s"),
    )

    return [
        one,
        _ratio(
            Target("two relays", "two relays: >= 1.6x one relay"),
            _metric(relay2, "promotions_per_s"),
            _metric(relay1, "promotions_per_s"),
            lambda r: r >= 1.6,
        ),
    ]


def _end_to_end(results: Results) -> list[Target]:
    pg = "postgresql"
    ours100 = _row(results, "end_to_end", impl="ours", db=pg, offered_per_s=100)
    b100 = _row(results, "end_to_end", impl="baseline_b", db=pg, offered_per_s=100)
    targets = [
        _absolute(
            Target("end to end p99", "end to end at 100 txn/s, PostgreSQL: p99 <= 40 ms"),
            _metric(ours100, "p99_ms"),
            lambda v: v <= 40,
        ),
        _ratio(
            Target("end to end vs B", "the same: p99 <= 0.35x baseline B's p99"),
            _metric(ours100, "p99_ms"),
            _metric(b100, "p99_ms"),
            lambda r: r <= 0.35,
        ),
        _ratio(
            Target(
                "broker CPU vs B",
                "the same: the broker's cores per delivered transaction <= 2x baseline B's",
            ),
            _per_delivered(ours100, "cores_broker"),
            _per_delivered(b100, "cores_broker"),
            lambda r: r <= 2.0,
        ),
    ]
    load = sustained_load(results, pg)
    target = Target(
        "end to end at a shared rate vs B",
        "the highest offered load both sustain (achieved >= 95%), PostgreSQL: p99 < B's",
    )
    if load is not None:
        target = _ratio(
            target,
            _metric(_row(results, "end_to_end", impl="ours", db=pg, offered_per_s=load), "p99_ms"),
            _metric(
                _row(results, "end_to_end", impl="baseline_b", db=pg, offered_per_s=load),
                "p99_ms",
            ),
            lambda r: r < 1,
        )
        target.note = f"at {load:,} txn/s offered"
    targets.append(target)
    return targets


def sustained_load(results: Results, db: str, share: float = 0.95) -> int | None:
    """The highest end-to-end offered load at which ours and baseline B both achieved at least
    ``share`` of it (the median run), or None when no load was."""
    found = results.get("end_to_end")
    if found is None:
        return None
    loads = sorted({r.config["offered_per_s"] for r in found.rows if r.config["db"] == db})
    kept = None
    for load in loads:
        achieved = [
            _metric(found.find(impl=impl, db=db, offered_per_s=load), "achieved_per_s")
            for impl in ("ours", "baseline_b")
        ]
        if all(a is not None and a.median >= share * load for a in achieved):
            kept = load
    return kept


def _per_delivered(row: Row | None, metric: str) -> Summary | None:
    """``metric`` (cores) per 1,000 delivered transactions/s, from the medians (the spread is
    not carried: a run's cores and its rate are not paired in the results)."""
    cores, rate = _metric(row, metric), _metric(row, "achieved_per_s")
    if cores is None or rate is None or rate.median <= 0:
        return None
    return Summary.of([1000 * cores.median / rate.median], unit="cores per 1,000 txn/s")

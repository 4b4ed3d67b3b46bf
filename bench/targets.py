"""The speed targets (issue 30's, with issue 29's asyncio one and two of issue 8), each computed
from what this run measured; never hard-coded.

A target whose figures were not measured in this run (a scenario skipped, a smaller audit in a
quick run) says so instead of passing or failing.
"""

from __future__ import annotations

from collections.abc import Callable

from bench.model import Row
from bench.stats import Summary
from bench.target_model import (
    Results,
    Target,
    absolute,
    interleaved,
    metric_of,
    ratio,
    row_of,
)

AUDIT_TARGET_TXNS = 1_000_000


def evaluate(results: Results) -> list[Target]:
    """The speed targets of issue 30 (and the asyncio one of issue 29, the checker's and two
    relays' of issue 8) against this run's figures: ratios to a baseline run beside ours."""
    targets = [*_producer(results), *_relay(results), *_end_to_end(results)]
    checker = row_of(results, "checker", db="postgresql")
    targets.append(
        absolute(
            Target("checker", "checker, PostgreSQL: >= 2,000 resolutions/s"),
            metric_of(checker, "resolutions_per_s"),
            lambda v: v >= 2000,
        )
    )
    targets += _audit(results)
    return targets


def _audit(results: Results) -> list[Target]:
    """One target per Java the audit ran on (the project's, and a JDK 25+ where the machine
    has one: bench.audit_path), so that neither hides the other."""
    rows: list[Row | None] = list(results["audit"].rows) if "audit" in results else []
    targets = []
    for audit in rows or [None]:
        java = audit.config.get("java") if audit is not None else None
        on = f", Java {java}" if java else ""
        target = absolute(
            Target("audit", f"audit of 1,000,000 transactions on local[2]{on}: <= 70 s"),
            metric_of(audit, "audit_s"),
            lambda v: v <= 70,
        )
        if audit is not None and audit.config.get("transactions") != AUDIT_TARGET_TXNS:
            count = audit.config["transactions"]
            target.note = f"measured on {count:,} transactions, not 1,000,000"
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
        return row_of(results, "producer_async", impl=impl, db="postgresql", tasks=16)

    def async_rate(impl: str) -> Summary | None:
        return metric_of(async_row(impl), "txn_per_s")

    target = ratio(
        Target(
            "asyncio producer vs A",
            "asyncio, 16 tasks, PostgreSQL: >= 0.9x async baseline A's txn/s (issue 29)",
        ),
        async_rate("ours"),
        async_rate("baseline_a"),
        lambda r: r >= 0.9,
        paired=interleaved(async_row("ours"), async_row("baseline_a")),
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
    ours = row_of(results, "producer", impl="ours", db=db, workers=workers, messages=1)
    a = row_of(results, "producer", impl="baseline_a", db=db, workers=workers, messages=1)
    floor = row_of(results, "producer", impl="protocol_floor", db=db, workers=workers, messages=1)
    plural = "s" if workers > 1 else ""
    target = ratio(
        Target(f"{label}, {name}", f"{workers} worker{plural}, {name}, 1 msg/txn: {goal}"),
        metric_of(ours, metric),
        metric_of(a, metric),
        ok,
        paired=interleaved(ours, a),
    )
    target.note = _floor_note(metric_of(floor, metric), metric_of(a, metric))
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
    relay1 = row_of(results, "relay", impl="ours", relays=1)
    relay2 = row_of(results, "relay", impl="ours", relays=2)
    b1 = row_of(results, "relay", impl="baseline_b", db="postgresql", relays=1)
    floor = row_of(results, "relay", impl="protocol_floor", relays=1)
    jvm = row_of(results, "relay", impl="protocol_floor_jvm", relays=1)
    one = ratio(
        Target("one relay vs B", "one relay: >= 1.3x baseline B's polling relay (PostgreSQL)"),
        metric_of(relay1, "promotions_per_s"),
        metric_of(b1, "promotions_per_s"),
        lambda r: r >= 1.3,
    )
    one.note = _relay_floor_note(
        metric_of(floor, "promotions_per_s"),
        metric_of(jvm, "promotions_per_s"),
        metric_of(b1, "promotions_per_s"),
    )

    return [
        one,
        ratio(
            Target("two relays", "two relays: >= 1.6x one relay"),
            metric_of(relay2, "promotions_per_s"),
            metric_of(relay1, "promotions_per_s"),
            lambda r: r >= 1.6,
        ),
    ]


def _end_to_end(results: Results) -> list[Target]:
    pg = "postgresql"
    ours100 = row_of(results, "end_to_end", impl="ours", db=pg, offered_per_s=100)
    b100 = row_of(results, "end_to_end", impl="baseline_b", db=pg, offered_per_s=100)
    targets = [
        absolute(
            Target("end to end p99", "end to end at 100 txn/s, PostgreSQL: p99 <= 40 ms"),
            metric_of(ours100, "p99_ms"),
            lambda v: v <= 40,
        ),
        ratio(
            Target("end to end vs B", "the same: p99 <= 0.35x baseline B's p99"),
            metric_of(ours100, "p99_ms"),
            metric_of(b100, "p99_ms"),
            lambda r: r <= 0.35,
        ),
        ratio(
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
        target = ratio(
            target,
            metric_of(
                row_of(results, "end_to_end", impl="ours", db=pg, offered_per_s=load), "p99_ms"
            ),
            metric_of(
                row_of(results, "end_to_end", impl="baseline_b", db=pg, offered_per_s=load),
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
            metric_of(found.find(impl=impl, db=db, offered_per_s=load), "achieved_per_s")
            for impl in ("ours", "baseline_b")
        ]
        if all(a is not None and a.median >= share * load for a in achieved):
            kept = load
    return kept


def _per_delivered(row: Row | None, metric: str) -> Summary | None:
    """``metric`` (cores) per 1,000 delivered transactions/s, from the medians (the spread is
    not carried: a run's cores and its rate are not paired in the results)."""
    cores, rate = metric_of(row, metric), metric_of(row, "achieved_per_s")
    if cores is None or rate is None or rate.median <= 0:
        return None
    return Summary.of([1000 * cores.median / rate.median], unit="cores per 1,000 txn/s")

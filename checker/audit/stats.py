"""Statistics of the audited transactions: counts by state and decider, latency distributions.

Latencies (ms) are differences of broker timestamps: half record (LogAppendTime) -> decision
(the winning op's LogAppendTime) -> promotion (the last message's record on its real topic,
whose timestamp is the relay's clock unless the topic uses LogAppendTime). Percentiles come
from ``percentile_approx`` (rank error below 1/10,000); maxima are exact. Histograms use
quarter-decade bins, so that milliseconds and minutes fit on one chart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from checker.audit.bins import BINS_PER_DECADE
from outbox.protocol.states import TERMINAL_STATES, OpState

TERMINAL = sorted(s.value for s in TERMINAL_STATES)
COMMIT = OpState.COMMIT.value
PERCENTILES = (0.5, 0.9, 0.99)


def latency_columns() -> dict[str, Column]:
    """Per-transaction latencies (ms), null where they do not apply. A resumed transaction's
    half records are the copies its resume put back: its latencies start there, not hours
    before with its first half record (read or not, depending on the lookback)."""
    decided = F.col("state").isin(TERMINAL)
    complete = (F.col("state") == COMMIT) & (F.col("delivered") >= F.col("expected"))
    halves_ms = F.coalesce(F.col("resumed_ms"), F.col("first_half_ms"))
    return {
        "half_to_decision": F.when(decided, F.col("decision_ms") - halves_ms),
        "decision_to_promotion": F.when(complete, F.col("last_promoted_ms") - F.col("decision_ms")),
        "half_to_promotion": F.when(complete, F.col("last_promoted_ms") - halves_ms),
    }


def _totals(as_of_ms: int, grace_ms: int, window_ms: int) -> list[Column]:
    committed = F.col("state") == COMMIT
    undecided = F.col("state").isNull() | (F.col("state") == OpState.RESUMED.value)
    started = F.when(F.col("state") == OpState.RESUMED.value, F.col("resumed_ms")).otherwise(
        F.coalesce(F.col("first_half_ms"), F.col("first_op_ms"))
    )  # as findings.decisions.undecided_since: a resume starts the clock again
    in_flight = (
        committed
        & (F.col("delivered") < F.col("expected"))
        & (F.col("decision_ms") > F.lit(as_of_ms - grace_ms))
    )
    return [
        F.count(F.lit(1)).alias("transactions"),
        F.sum(F.when(committed, F.col("expected"))).alias("messages_committed"),
        F.sum(F.when(committed, F.col("delivered"))).alias("messages_delivered"),
        F.sum("promoted_records").alias("promoted_records"),
        F.sum(F.coalesce(F.col("copies"), F.lit(0))).alias("put_back_copies"),
        F.sum(F.coalesce(F.col("repeated_ops"), F.lit(0))).alias("repeated_terminal_ops"),
        F.sum(in_flight.cast("int")).alias("awaiting_promotion"),
        F.sum((undecided & (started > F.lit(as_of_ms - window_ms))).cast("int")).alias(
            "pending_decision"
        ),
    ]


@dataclass(frozen=True)
class Statistics:
    """Counts over the in-scope transactions, latency percentiles, and each latency's
    ``(bin, count)`` pairs in bin order."""

    counts: dict[str, Any]
    latencies: dict[str, dict[str, int | None]]
    histograms: dict[str, list[tuple[int, int]]]


def statistics(ledger: DataFrame, *, as_of_ms: int, grace_ms: int, window_ms: int) -> Statistics:
    """Counts over the in-scope transactions (by state, by decider, still in flight), the
    latency percentiles and histograms: two Spark jobs, one aggregate and one grouping (the
    histograms' bins are grouped with the states, not in a job of their own)."""
    columns = latency_columns()
    scoped = ledger.withColumns(columns)
    latency_aggregates = []
    for name in columns:
        latency_aggregates += [
            F.count(name).alias(f"{name}__count"),
            F.percentile_approx(name, list(PERCENTILES), 10_000).alias(f"{name}__p"),
            F.max(name).alias(f"{name}__max"),
        ]
    in_scope = scoped.filter(F.col("in_scope"))
    row = in_scope.agg(*_totals(as_of_ms, grace_ms, window_ms), *latency_aggregates).first()
    values = row.asDict() if row is not None else {}
    counts: dict[str, Any] = {
        k: int(values.get(k) or 0) for k in (c for c in values if "__" not in c)
    }
    state = F.coalesce(F.col("state"), F.lit("UNDECIDED"))
    bins = [bin_of(F.col(name)).alias(f"{name}__bin") for name in columns]
    groups = (
        scoped.groupBy(F.col("in_scope"), state.alias("state"), F.col("decided_by"), *bins)
        .count()
        .collect()
    )
    by_state: dict[str, int] = {}
    by_decider: dict[str, int] = {}
    by_state_decider: dict[str, dict[str, int]] = {}
    binned: dict[str, dict[int, int]] = {name: {} for name in columns}
    out_of_scope = 0
    for g in groups:
        if not g["in_scope"]:
            out_of_scope += g["count"]
            continue
        by_state[g["state"]] = by_state.get(g["state"], 0) + g["count"]
        if g["state"] in TERMINAL and g["decided_by"] is not None:
            by_decider[g["decided_by"]] = by_decider.get(g["decided_by"], 0) + g["count"]
            per_state = by_state_decider.setdefault(g["state"], {})
            per_state[g["decided_by"]] = per_state.get(g["decided_by"], 0) + g["count"]
        for name in columns:
            index = g[f"{name}__bin"]
            if index is not None:
                binned[name][int(index)] = binned[name].get(int(index), 0) + g["count"]
    counts.update(
        transactions_out_of_scope=out_of_scope,
        by_state=dict(sorted(by_state.items())),
        by_decider=dict(sorted(by_decider.items())),
        by_state_and_decider=dict(sorted(by_state_decider.items())),
    )
    latencies: dict[str, dict[str, int | None]] = {}
    for name in columns:
        ps = values.get(f"{name}__p") or [None] * len(PERCENTILES)
        latencies[name] = {
            "count": int(values.get(f"{name}__count") or 0),
            "p50": ps[0],
            "p90": ps[1],
            "p99": ps[2],
            "max": values.get(f"{name}__max"),
        }
    histograms = {name: sorted(pairs.items()) for name, pairs in binned.items()}
    return Statistics(counts, latencies, histograms)


def bin_of(value: Column) -> Column:
    """Histogram bin: 0 for < 1 ms (and clock skew below 0), then quarter decades."""
    return F.when(value < 1, F.lit(0)).otherwise(
        F.floor(F.log10(value) * BINS_PER_DECADE).cast("int") + 1
    )

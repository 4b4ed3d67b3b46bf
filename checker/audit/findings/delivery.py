"""Findings about what reached the real topics: lost, partial, phantom, duplicate."""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from outbox.protocol.states import OpState

COMMIT = OpState.COMMIT.value

#: The columns of a transaction-level delivery finding.
TXN_COLUMNS = [
    "txn_id",
    "producer_group",
    "half_partition",
    "half_offsets",
    "real_topics",
    "first_half_ms",
    "state",
    "decided_by",
    "decision_ms",
    "decision_partition",
    "decision_offset",
    "expected",
    "delivered",
]


def _committed_past_grace(
    ledger: DataFrame, as_of_ms: int, grace_ms: int, complete_since_ms: Mapping[str, int] | None
) -> DataFrame:
    """In-scope COMMITs decided ``grace_ms`` before the audit's clock, whose real topics were
    all complete when they were decided: a topic that has since lost records to retention
    (``complete_since_ms``, :mod:`checker.audit.retained`) no longer shows what reached it."""
    judged = (
        F.col("in_scope")
        & (F.col("state") == COMMIT)
        & (F.col("decision_ms") <= F.lit(as_of_ms - grace_ms))
    )
    if complete_since_ms:
        since = F.create_map(
            *[F.lit(x) for t, ms in sorted(complete_since_ms.items()) for x in (t, ms)]
        )
        emptied = F.exists(
            F.coalesce(F.col("real_topics"), F.array().cast("array<string>")),
            lambda t: F.coalesce(F.try_element_at(since, t) > F.col("decision_ms"), F.lit(False)),
        )
        judged = judged & ~emptied
    return ledger.filter(judged)


def _missing_indices() -> Column:
    wanted = F.sequence(F.lit(0), F.greatest(F.col("expected") - 1, F.lit(0)))
    wanted = F.when(F.col("expected") > 0, wanted).otherwise(F.array().cast("array<int>"))
    return F.array_except(wanted, F.col("delivered_indices")).alias("missing_indices")


def lost(
    ledger: DataFrame,
    *,
    as_of_ms: int,
    grace_ms: int,
    complete_since_ms: Mapping[str, int] | None = None,
) -> DataFrame:
    """Committed transactions, decided at least ``grace_ms`` before ``as_of_ms``, of which no
    message reached its real topic (among those whose real topics still hold everything since
    their decision: ``complete_since_ms``)."""
    found = _committed_past_grace(ledger, as_of_ms, grace_ms, complete_since_ms).filter(
        (F.col("delivered") == 0) & (F.col("expected") > 0)
    )
    return found.select(*TXN_COLUMNS, _missing_indices())


def partial(
    ledger: DataFrame,
    *,
    as_of_ms: int,
    grace_ms: int,
    complete_since_ms: Mapping[str, int] | None = None,
) -> DataFrame:
    """Committed transactions, past the grace period, with some but not all messages
    delivered (judged as :func:`lost` judges)."""
    found = _committed_past_grace(ledger, as_of_ms, grace_ms, complete_since_ms).filter(
        (F.col("delivered") > 0) & (F.col("delivered") < F.col("expected"))
    )
    return found.select(*TXN_COLUMNS, _missing_indices())


def phantom(promoted: DataFrame, ledger: DataFrame) -> DataFrame:
    """Records on real topics without a COMMIT behind them, one row per record.

    Records of transactions the half and op topics show began before the range are not judged;
    a record whose transaction neither topic shows is judged when it is itself in range.
    """
    known = ledger.select(
        "txn_id",
        "in_scope",
        "state",
        "decided_by",
        "decision_ms",
        "expected",
        F.col("producer_group").alias("known_group"),
    )
    records = promoted.filter(F.col("txn_id").isNotNull()).join(known, "txn_id", "left")
    unknown = F.col("in_scope").isNull()
    beyond = (F.col("message_index") < 0) | (F.col("message_index") >= F.col("expected"))
    reason = (
        F.when(unknown, F.lit("no half or op record of this transaction was read"))
        .when(F.col("state").isNull(), F.lit("no decision"))
        .when(F.col("state") == OpState.RESUMED.value, F.lit("resumed, not decided again"))
        .when(F.col("state") != COMMIT, F.concat(F.lit("decided "), F.col("state")))
        .when(beyond, F.lit("message index past the committed message count"))
    )
    judged = (unknown & F.col("in_range")) | F.coalesce(F.col("in_scope"), F.lit(False))
    return (
        records.withColumn("reason", reason)
        .filter(judged & F.col("reason").isNotNull())
        .select(
            "txn_id",
            F.coalesce(F.col("known_group"), F.col("producer_group")).alias("producer_group"),
            "topic",
            "partition",
            "offset",
            "ts_ms",
            "message_index",
            "state",
            "decided_by",
            "decision_ms",
            "reason",
        )
    )


def duplicate(delivered: DataFrame, ledger: DataFrame) -> DataFrame:
    """Messages of in-scope transactions found more than once on the real topics."""
    scope = ledger.filter(F.col("in_scope")).select("txn_id", "producer_group", "state")
    return (
        delivered.filter(F.col("times") > 1)
        .join(scope, "txn_id")
        .select("txn_id", "producer_group", "state", "message_index", "times", "records")
    )

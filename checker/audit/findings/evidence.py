"""Findings that compare the op topic with the producers' evidence tables.

The evidence table (``outbox_evidence``) holds ``kind='evidence'`` exactly for transactions
whose local transaction committed, and ``kind='fence'`` for ones a check fenced (they can never
commit). So a COMMIT op needs an evidence row, and an evidence row needs a COMMIT op.

Two kinds of committed transaction have no row by design, and a COMMIT of theirs is no
violation: those whose checks something else answers (``outbox-check-by: listener``, the
transactions of ``TransactionalProducer``), and those whose row ``outbox.pruning`` may have
deleted (begun before the table's pruning horizon).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from checker.audit.findings.decisions import undecided_since
from outbox.protocol.states import CheckBy, OpState
from outbox.pruning import PRUNE_MARGIN_MS

EVIDENCE = "evidence"
FENCE = "fence"


def evidence_without_commit(
    ledger: DataFrame, evidence: DataFrame, *, as_of_ms: int, window_ms: int
) -> DataFrame:
    """Committed locally (an evidence row), but rolled back, given up, or still undecided after
    the full check window, for in-scope transactions."""
    committed = evidence.filter(F.col("kind") == EVIDENCE).select(
        "txn_id", F.col("created_ms").alias("evidence_created_ms")
    )
    undecided = F.col("state").isNull() | (F.col("state") == OpState.RESUMED.value)
    overdue = undecided & (undecided_since() <= F.lit(as_of_ms - window_ms))
    contradicted = F.col("state").isin(OpState.ROLLBACK.value, OpState.GIVEN_UP.value)
    return (
        ledger.filter(F.col("in_scope"))
        .join(committed, "txn_id")
        .filter(contradicted | overdue)
        .select(
            "txn_id",
            "producer_group",
            "evidence_created_ms",
            F.coalesce(F.col("state"), F.lit("UNDECIDED")).alias("state"),
            "decided_by",
            "decision_ms",
            "decision_partition",
            "decision_offset",
            "first_half_ms",
            "reason",
        )
    )


def answered_by_evidence() -> Column:
    """Whether a ledger row's checks are answered by the evidence table: its half records carry
    no ``outbox-check-by`` other than ``evidence``. Without half records (retention) it is not
    known, and taken to be: the form every transaction had before the header existed."""
    return F.coalesce(F.col("check_by"), F.lit(CheckBy.EVIDENCE.value)) == F.lit(
        CheckBy.EVIDENCE.value
    )


def maybe_pruned(horizon_ms: int | None) -> Column:
    """Whether the evidence row of a ledger row's transaction may have been pruned: it began
    before ``horizon_ms`` plus :data:`~outbox.pruning.PRUNE_MARGIN_MS`, as the check endpoint
    judges it (``outbox.checks.resolver``). When it began is its id's UUIDv7 time, the first
    48 bits (12 hex digits), on the producer clock that stamped its row; an id of another UUID
    version has no known age, so its row may have been pruned too."""
    if horizon_ms is None:
        return F.lit(False)
    began = F.conv(F.substring(F.regexp_replace("txn_id", "-", ""), 1, 12), 16, 10).cast("long")
    not_v7 = F.substring("txn_id", 15, 1) != F.lit("7")
    return not_v7 | (began < F.lit(horizon_ms + PRUNE_MARGIN_MS))


def commit_without_evidence(
    ledger: DataFrame,
    evidence: DataFrame,
    *,
    groups: Sequence[str] = (),
    horizon_ms: int | None = None,
) -> DataFrame:
    """COMMIT ops of in-scope transactions of the groups the table covers (``groups``, else
    the groups found in it) that have no evidence row, or a fence row.

    Not judged: transactions whose checks the evidence table does not answer
    (:func:`answered_by_evidence`), which never write a row; and, when the table was pruned
    (``horizon_ms``, Unix ms), transactions with no row that began before the horizon
    (:func:`maybe_pruned`). A fence row that is still there is reported whenever it began.
    """
    spark = evidence.sparkSession
    covered = (
        spark.createDataFrame([(g,) for g in groups], "producer_group string")
        if groups
        else evidence.select("producer_group").distinct()
    )
    rows = evidence.select("txn_id", F.col("kind").alias("evidence_kind"))
    committed = F.col("in_scope") & (F.col("state") == OpState.COMMIT.value)
    missing = F.col("evidence_kind").isNull() & ~maybe_pruned(horizon_ms)
    return (
        ledger.filter(committed & answered_by_evidence())
        .join(F.broadcast(covered), "producer_group")
        .join(rows, "txn_id", "left")
        .filter(missing | (F.col("evidence_kind") == FENCE))
        .select(
            "txn_id",
            "producer_group",
            "decided_by",
            "decision_ms",
            "decision_partition",
            "decision_offset",
            "first_half_ms",
            F.coalesce(F.col("evidence_kind"), F.lit("none")).alias("evidence"),
        )
    )

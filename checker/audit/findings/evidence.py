"""Findings that compare the op topic with the producers' evidence tables.

The evidence table (``outbox_evidence``) holds ``kind='evidence'`` exactly for transactions
whose local transaction committed, and ``kind='fence'`` for ones a check fenced (they can never
commit). So a COMMIT op needs an evidence row, and an evidence row needs a COMMIT op.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from checker.audit.findings.decisions import undecided_since
from outbox.protocol.states import OpState

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


def commit_without_evidence(
    ledger: DataFrame, evidence: DataFrame, *, groups: Sequence[str] = ()
) -> DataFrame:
    """COMMIT ops of in-scope transactions of the groups the table covers (``groups``, else
    the groups found in it) that have no evidence row, or a fence row."""
    spark = evidence.sparkSession
    covered = (
        spark.createDataFrame([(g,) for g in groups], "producer_group string")
        if groups
        else evidence.select("producer_group").distinct()
    )
    rows = evidence.select("txn_id", F.col("kind").alias("evidence_kind"))
    return (
        ledger.filter(F.col("in_scope") & (F.col("state") == OpState.COMMIT.value))
        .join(F.broadcast(covered), "producer_group")
        .join(rows, "txn_id", "left")
        .filter(F.col("evidence_kind").isNull() | (F.col("evidence_kind") == FENCE))
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

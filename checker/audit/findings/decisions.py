"""Findings about decisions: stuck, given up, conflicting decisions."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from checker.audit.ledger import ranked_ops
from outbox.protocol.states import OpState

RESUMED = OpState.RESUMED.value


def undecided_since() -> Column:
    """When an undecided transaction's clock started: its resume, else its first record."""
    return F.when(F.col("state") == RESUMED, F.col("resumed_ms")).otherwise(
        F.coalesce(F.col("first_half_ms"), F.col("first_op_ms"))
    )


def stuck(ledger: DataFrame, *, as_of_ms: int, window_ms: int) -> DataFrame:
    """In-scope transactions with no decision for longer than the full check window."""
    undecided = F.col("state").isNull() | (F.col("state") == RESUMED)
    found = ledger.filter(F.col("in_scope") & undecided).withColumn("since_ms", undecided_since())
    return found.filter(F.col("since_ms") <= F.lit(as_of_ms - window_ms)).select(
        "txn_id",
        "producer_group",
        "half_partition",
        "half_offsets",
        "real_topics",
        "first_half_ms",
        "since_ms",
        (F.lit(as_of_ms) - F.col("since_ms")).alias("age_ms"),
        F.coalesce(F.col("state"), F.lit("UNDECIDED")).alias("state"),
        "check_count",
        "messages_seen",
        "copies",
    )


def given_up(ledger: DataFrame, dead_letters: DataFrame) -> DataFrame:
    """In-scope transactions whose decision is GIVEN_UP, with their dead letters counted."""
    parked = dead_letters.groupBy("txn_id").agg(
        F.countDistinct("message_index").alias("dead_lettered")
    )
    found = ledger.filter(F.col("in_scope") & (F.col("state") == OpState.GIVEN_UP.value))
    return found.join(parked, "txn_id", "left").select(
        "txn_id",
        "producer_group",
        "half_partition",
        "half_offsets",
        "real_topics",
        "first_half_ms",
        "decision_ms",
        "decided_at_ms",
        "decided_by",
        "reason",
        "expected",
        F.coalesce(F.col("dead_lettered"), F.lit(0)).alias("dead_lettered"),
    )


def conflicting_decisions(ops: DataFrame, ledger: DataFrame) -> DataFrame:
    """Terminal ops that contradict the winning one of their epoch, and RESUMED ops that follow
    a COMMIT or ROLLBACK, for in-scope transactions. One row per contradicting op.

    Epochs are separated by RESUMED ops: a COMMIT after GIVEN_UP + RESUMED starts a new epoch
    and contradicts nothing. A repeat of the winning state is a harmless duplicate decision.
    """
    ranked = ranked_ops(ops)
    winners = ranked.filter(F.col("rank") == 1).select(
        "txn_id",
        "epoch",
        F.col("state").alias("first_state"),
        F.col("decided_by").alias("first_decided_by"),
        F.col("partition").alias("first_partition"),
        F.col("offset").alias("first_offset"),
        F.col("ts_ms").alias("first_ms"),
    )
    later = ranked.filter((F.col("rank") > 1) | (F.col("state") == RESUMED)).withColumn(
        "judged_epoch",
        F.when(F.col("state") == RESUMED, F.col("epoch") - 1).otherwise(F.col("epoch")),
    )
    against = later.join(
        winners.withColumnRenamed("epoch", "judged_epoch"), ["txn_id", "judged_epoch"]
    )
    contradicts = F.when(
        F.col("state") == RESUMED, F.col("first_state") != OpState.GIVEN_UP.value
    ).otherwise(F.col("state") != F.col("first_state"))
    scope = ledger.filter(F.col("in_scope")).select("txn_id")
    return (
        against.filter(contradicts)
        .join(scope, "txn_id")
        .select(
            "txn_id",
            "producer_group",
            "first_state",
            "first_decided_by",
            "first_partition",
            "first_offset",
            "first_ms",
            F.col("state").alias("conflicting_state"),
            F.col("decided_by").alias("conflicting_decided_by"),
            F.col("partition").alias("conflicting_partition"),
            F.col("offset").alias("conflicting_offset"),
            F.col("ts_ms").alias("conflicting_ms"),
        )
    )

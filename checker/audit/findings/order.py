"""The ordering finding: for one key, records promoted in the order of their COMMIT ops.

The contract (docs/protocol.md, *Partitioning*): transactions whose first message has the same
key share a half/op partition, and the relay promotes them in the order of their COMMIT ops on
it; a transaction's messages go out in message-index order. So on each real topic partition,
for one key and one op partition, (COMMIT op offset, message index) never goes down. Only the
first copy of a message counts (repeats are the *duplicate* finding), and records of different
op partitions are not compared (nothing orders them).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from outbox.protocol.states import OpState


def out_of_order(delivered: DataFrame, ledger: DataFrame) -> DataFrame:
    """Records promoted after a record that should have come after them. The row names the
    record that arrived too late and the one it followed.

    ``delivered`` is :func:`checker.audit.ledger.deliveries`: each message's first keyed copy.
    """
    committed = ledger.filter(F.col("in_scope") & (F.col("state") == OpState.COMMIT.value)).select(
        "txn_id", "producer_group", "decision_partition", "decision_offset"
    )
    first = F.col("first_keyed")
    firsts = (
        delivered.filter(first.isNotNull())
        .select(
            "txn_id",
            "message_index",
            *(first[c].alias(c) for c in ("topic", "partition", "offset", "ts_ms", "key")),
        )
        .join(committed, "txn_id")
    )
    same_stream = Window.partitionBy("topic", "partition", "key", "decision_partition").orderBy(
        "offset"
    )
    previous = {
        "prev_txn_id": F.lag("txn_id").over(same_stream),
        "prev_index": F.lag("message_index").over(same_stream),
        "prev_offset": F.lag("offset").over(same_stream),
        "prev_commit_offset": F.lag("decision_offset").over(same_stream),
    }
    compared = firsts.withColumns(previous)
    behind = (F.col("prev_commit_offset") > F.col("decision_offset")) | (
        (F.col("prev_commit_offset") == F.col("decision_offset"))
        & (F.col("prev_index") > F.col("message_index"))
    )
    return compared.filter(behind).select(
        "txn_id",
        "producer_group",
        "topic",
        "partition",
        "offset",
        "ts_ms",
        F.col("key").cast("string").alias("key"),
        "message_index",
        F.col("decision_partition").alias("commit_partition"),
        F.col("decision_offset").alias("commit_offset"),
        F.col("prev_txn_id").alias("after_txn_id"),
        F.col("prev_offset").alias("after_offset"),
        F.col("prev_commit_offset").alias("after_commit_offset"),
    )

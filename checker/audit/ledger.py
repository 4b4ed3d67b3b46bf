"""From typed records to one row per transaction: what was sent, decided and delivered.

- :func:`messages`: one row per message, (txn id, message index), put-back copies folded in;
- :func:`transactions`: the half-topic view of each transaction;
- :func:`decisions`: the op-topic view: the winning terminal op (the first one after the latest
  RESUMED), who decided and when;
- :func:`deliveries`: the real-topic view: which messages arrived, how often, when;
- :func:`ledger`: all three joined, with ``in_scope`` (its first half record lies in the range).

All pure functions on DataFrames; :mod:`checker.audit.records` makes their inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from checker.audit.partitioning import by_transaction
from checker.audit.records import literal_map
from outbox.protocol.states import TERMINAL_STATES, CheckBy, OpState

TERMINAL = sorted(s.value for s in TERMINAL_STATES)


def _original_first(*columns: str) -> list[Column]:
    """Values of the original record, not of a put-back copy (copies come later)."""
    order = F.struct(F.col("is_copy"), F.col("offset"))
    return [F.min_by(F.col(c), order).alias(c) for c in columns]


def _check_by() -> Column:
    """What answers the checks: ``evidence`` only when every record says so, else a value one
    of them gives. A producer writes one value on all of a transaction's records; should they
    disagree, the transaction is not taken for one an evidence row answers."""
    other = F.col("check_by") != F.lit(CheckBy.EVIDENCE.value)
    return F.max_by(F.col("check_by"), other).alias("check_by")


def messages(halves: DataFrame) -> DataFrame:
    """One row per (txn_id, message_index): copies deduplicated, never a second message.

    ``in_range`` / ``has_original`` come from the original record: a message known only from a
    copy began before what was read and is out of scope.
    """
    df = halves.withColumn("is_copy", F.col("origin_offset").isNotNull()).withColumn(
        "original_offset", F.coalesce(F.col("origin_offset"), F.col("offset"))
    )
    return df.groupBy("txn_id", "message_index").agg(
        *_original_first("producer_group", "real_topic", "real_key", "partition"),
        F.min("original_offset").alias("original_offset"),
        F.min("ts_ms").alias("first_ts_ms"),
        F.max(F.col("in_range") & ~F.col("is_copy")).alias("in_range"),
        F.max(~F.col("is_copy")).alias("has_original"),
        F.sum(F.col("is_copy").cast("int")).alias("copies"),
        F.max("check_count").alias("check_count"),
        F.max("message_count").alias("message_count"),
        _check_by(),
    )


def transactions(messages_df: DataFrame) -> DataFrame:
    """One row per transaction seen on the half topic."""
    by_index = F.sort_array(F.collect_list(F.struct("message_index", "original_offset")))
    first = F.struct(F.col("first_ts_ms"), F.col("message_index"))
    return messages_df.groupBy("txn_id").agg(
        F.first("producer_group").alias("producer_group"),
        F.min("partition").alias("half_partition"),
        F.transform(by_index, lambda m: m["original_offset"]).alias("half_offsets"),
        F.min("first_ts_ms").alias("first_half_ms"),
        F.count(F.lit(1)).alias("messages_seen"),
        F.max("message_count").alias("announced_count"),
        F.array_sort(F.collect_set("real_topic")).alias("real_topics"),
        F.min_by(F.col("in_range") & F.col("has_original"), first).alias("half_in_range"),
        F.sum("copies").alias("copies"),
        F.max("check_count").alias("check_count"),
        _check_by(),
    )


def ranked_ops(ops: DataFrame) -> DataFrame:
    """Ops with their epoch (RESUMED ops seen so far) and their rank among the terminal ops of
    their epoch, in op-topic order. Rank 1 is the epoch's decision. Ops ranked already (one
    cached ranking serves :func:`decisions` and the conflicts finding) are returned as they are.
    """
    if {"epoch", "terminal", "rank"} <= set(ops.columns):
        return ops
    order = Window.partitionBy("txn_id").orderBy("partition", "offset")
    df = ops.withColumn(
        "epoch",
        F.sum((F.col("state") == F.lit(OpState.RESUMED.value)).cast("int")).over(
            order.rowsBetween(Window.unboundedPreceding, Window.currentRow)
        ),
    ).withColumn("terminal", F.col("state").isin(TERMINAL))
    by_epoch = Window.partitionBy("txn_id", "epoch", "terminal").orderBy("partition", "offset")
    return df.withColumn(
        "rank", F.when(F.col("terminal"), F.row_number().over(by_epoch)).otherwise(F.lit(None))
    )


def decisions(ops: DataFrame) -> DataFrame:
    """One row per transaction seen on the op topic: its decision.

    ``state`` is the winning terminal op of the latest epoch, or ``RESUMED`` when an operator
    resumed it and no terminal op followed yet; ``decision_ms`` is that op's broker time.
    """
    ranked = ranked_ops(ops)
    last_epoch = F.max("epoch").over(Window.partitionBy("txn_id"))
    ranked = ranked.withColumn("last_epoch", last_epoch)
    winners = ranked.filter((F.col("rank") == 1) & (F.col("epoch") == F.col("last_epoch")))
    summary = ranked.groupBy("txn_id").agg(
        F.min_by(F.col("producer_group"), F.struct("partition", "offset")).alias("op_group"),
        F.min_by(F.col("half_partition"), F.struct("partition", "offset")).alias("op_partition"),
        F.min_by(F.col("in_range"), F.struct("partition", "offset")).alias("op_in_range"),
        F.min("ts_ms").alias("first_op_ms"),
        F.max(F.when(F.col("state") == OpState.RESUMED.value, F.col("ts_ms"))).alias("resumed_ms"),
        F.max_by(
            F.col("in_range"),
            F.when(F.col("state") == OpState.RESUMED.value, F.struct("partition", "offset")),
        ).alias("resumed_in_range"),
        F.sum((F.col("terminal") & (F.col("rank") > 1)).cast("int")).alias("repeated_ops"),
    )
    decided = winners.select(
        "txn_id",
        "state",
        "decided_by",
        "decided_at_ms",
        "reason",
        F.col("ts_ms").alias("decision_ms"),
        F.col("partition").alias("decision_partition"),
        F.col("offset").alias("decision_offset"),
        F.col("half_offsets").alias("op_half_offsets"),
        F.col("message_count").alias("op_message_count"),
    )
    joined = summary.join(decided, "txn_id", "left")
    return joined.withColumn(
        "state",
        F.when(
            F.col("state").isNull() & F.col("resumed_ms").isNotNull(), F.lit("RESUMED")
        ).otherwise(F.col("state")),
    )


def deliveries(promoted: DataFrame) -> DataFrame:
    """One row per (txn_id, message_index) found on the real topics, with how often.

    ``first_keyed`` is the message's first copy with a key, by (topic, partition, offset): what
    the ordering finding compares (:mod:`checker.audit.findings.order`), taken in this pass so
    that it does not read and sort the real topics' records again.
    """
    ours = promoted.filter(F.col("txn_id").isNotNull())
    first = F.struct("ts_ms", "topic", "partition", "offset")
    keyed = F.struct("topic", "partition", "offset", "ts_ms", "key")
    return ours.groupBy("txn_id", "message_index").agg(
        F.count(F.lit(1)).alias("times"),
        F.min("ts_ms").alias("first_ms"),
        F.min_by(F.col("topic"), first).alias("topic"),
        F.min_by(F.col("partition"), first).alias("partition"),
        F.min_by(F.col("offset"), first).alias("offset"),
        F.sort_array(F.collect_list(F.struct("topic", "partition", "offset", "ts_ms"))).alias(
            "records"
        ),
        F.min(F.when(F.col("key").isNotNull(), keyed)).alias("first_keyed"),
    )


def ledger(
    txns: DataFrame,
    decided: DataFrame,
    delivered: DataFrame,
    *,
    half_log_starts: Mapping[int, int] | None = None,
    half_read_from: Mapping[int, int] | None = None,
    refused: DataFrame | None = None,
) -> DataFrame:
    """One row per transaction known from the half or op topic.

    ``in_scope``: its first half record is in range; for a transaction with no half record in
    what was read, its first op is, unless the half offsets the op names lie below their
    partition's ``half_log_starts`` (``halves_removed``: retention removed them before the
    audit, and likely its real records too; only partitions read from their log start are
    given) and the relay did not refuse its op (``refused``: txn ids it dead-lettered an op of,
    which stay judged, ``op_refused``: a COMMIT never delivered); but a resumed transaction is
    in scope where its latest RESUMED op is in range, and nowhere else: what follows a resume
    is judged once, by the window it happens in, wherever its first records were.
    ``halves_unread``: known from its op alone (its op not refused), every half offset the op
    names lies below the first offset read of its partition (``half_read_from``; a partition
    of which nothing was read is left out of it): the transaction began before what was read
    (before ``--from`` less ``--lookback``, before the offsets ``--from`` names), so its real
    topics are not known - the real topics read are those the half records read name - and
    its messages missing there say nothing (:mod:`checker.audit.findings.delivery` counts them
    as unverifiable). Without ``half_read_from``, false. A transaction with half records
    read whose op names one below the first offset read of their partition began before what
    was read: out of scope, its first half record before the range (its later ones in it: it
    used to be in scope, its first messages' real topics unknown, its COMMIT ``partial``).
    ``expected`` is the COMMIT op's message count, or the count its halves announce or show
    where that is more (a COMMIT naming part of a transaction, which
    the relay refuses, leaves the rest undelivered; a transaction commits only once every send
    was acknowledged, so each message index on the half topic was committed - a producer that
    took a delivery report without an offset for none once wrote a COMMIT naming no record),
    else the count the halves announce or show.
    ``delivered_indices`` lists the messages found on the real topics. ``check_by`` (what
    answers its checks, from its half records) is null for a transaction known only from the
    op topic.
    """
    per_txn = delivered.groupBy("txn_id").agg(
        F.array_sort(F.collect_list("message_index")).alias("delivered_indices"),
        F.sum("times").alias("promoted_records"),
        F.min("first_ms").alias("first_promoted_ms"),
        F.max("first_ms").alias("last_promoted_ms"),
    )
    # Laid out by txn_id again before the last join: the full outer join's key is a coalesce,
    # which Spark cannot match to any layout, so every later join and the findings would
    # shuffle the ledger (partitioning.py).
    known = by_transaction(txns.join(decided, "txn_id", "full_outer"))
    df = known.join(per_txn, "txn_id", "left")
    if refused is not None:
        marked = refused.select("txn_id").distinct().withColumn("op_refused", F.lit(True))
        df = df.join(F.broadcast(marked), "txn_id", "left")
    else:
        df = df.withColumn("op_refused", F.lit(None).cast("boolean"))
    expected = F.when(
        F.col("state") == OpState.COMMIT.value,
        # greatest skips nulls
        F.greatest(F.col("op_message_count"), F.col("announced_count"), F.col("messages_seen")),
    ).otherwise(
        F.coalesce(F.col("announced_count"), F.col("messages_seen"), F.col("op_message_count"))
    )
    indices = F.coalesce(F.col("delivered_indices"), F.array().cast("array<int>"))
    valid = F.filter(indices, lambda i: (i >= 0) & (i < F.col("expected")))
    removed = _op_names_below(half_log_starts, F.array_min)
    unread = (
        _op_names_below(half_read_from, F.array_max, unknown=True)
        if half_read_from is not None
        else F.lit(False)
    )
    began_before = _began_before_read(half_read_from)
    return (
        df.withColumns(
            {
                # A resumed transaction, in the range of its latest resume alone: what follows
                # the resume is judged there (its copies and ops are read, its original half
                # records perhaps long before), and by no other window's audit.
                "in_scope": F.coalesce(
                    F.col("resumed_in_range"),
                    F.when(
                        F.col("first_half_ms").isNotNull(), F.col("half_in_range") & ~began_before
                    ),
                    F.when(~removed, F.col("op_in_range")),
                    F.lit(False),
                ),
                "producer_group": F.coalesce(F.col("producer_group"), F.col("op_group")),
                "half_partition": F.coalesce(F.col("half_partition"), F.col("op_partition")),
                "half_offsets": F.coalesce(F.col("half_offsets"), F.col("op_half_offsets")),
                "expected": expected,
                "halves_removed": removed,
                "halves_unread": unread,
                "op_refused": F.coalesce(F.col("op_refused"), F.lit(False)),
                "promoted_records": F.coalesce(F.col("promoted_records"), F.lit(0)),
                "delivered_indices": indices,
            }
        )
        .withColumn("delivered", F.size(F.array_distinct(valid)))
        .drop("op_group", "op_partition", "op_half_offsets")
    )


def _first_offset(first_offsets: Mapping[int, int] | None) -> Column:
    """The offset ``first_offsets`` gives the transaction's half partition (null: none)."""
    if not first_offsets:
        return F.lit(None).cast("long")
    return F.try_element_at(literal_map(first_offsets), F.col("op_partition"))


def _op_names_below(
    first_offsets: Mapping[int, int] | None,
    which: Callable[[Column], Column],
    *,
    unknown: bool = False,
) -> Column:
    """Whether a transaction known from its op alone (no half record read, its op not refused
    by the relay) names half offsets (``which`` of them: the least, the greatest) below its
    partition's offset in ``first_offsets``; ``unknown``: what a partition left out gives. An
    op naming no offset names none below."""
    first, named = _first_offset(first_offsets), which(F.col("op_half_offsets"))
    below = (
        F.when(named.isNull(), F.lit(False))
        .when(first.isNull(), F.lit(unknown))
        .otherwise(named < first)
    )
    return F.coalesce(
        F.col("first_half_ms").isNull() & below & F.col("op_refused").isNull(), F.lit(False)
    )


def _began_before_read(half_read_from: Mapping[int, int] | None) -> Column:
    """Whether a transaction with half records read names, in its op, a half offset below the
    first offset read of its partition: its first half record lies before what was read (and
    before the range), its later ones in it."""
    below = F.array_min(F.col("op_half_offsets")) < _first_offset(half_read_from)
    return F.coalesce(F.col("first_half_ms").isNotNull() & below, F.lit(False))

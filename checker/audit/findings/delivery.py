"""Findings about what reached the real topics: lost, partial, phantom, duplicate."""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from checker.audit.records import literal_map
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
    ledger: DataFrame,
    as_of_ms: int,
    grace_ms: int,
    complete_since_ms: Mapping[str, int] | None,
    *,
    verifiable: bool = True,
) -> DataFrame:
    """In-scope COMMITs decided ``grace_ms`` before the audit's clock whose real topics were
    all complete when they were decided (``verifiable=False``: those whose were not, and
    those whose real topics are not known: their half records lie before what was read,
    ``halves_unread``). A topic that has lost records to retention since
    (``complete_since_ms``, :mod:`checker.audit.retained`) no longer shows what reached it
    before then."""
    judged = (
        F.col("in_scope")
        & (F.col("state") == COMMIT)
        & (F.col("decision_ms") <= F.lit(as_of_ms - grace_ms))
    )
    emptied: Column = F.lit(False)
    if complete_since_ms:
        since = literal_map(complete_since_ms)
        # known from its op alone, its real topics are not: any of those read may hold it
        latest = F.lit(max(complete_since_ms.values()))
        emptied = F.when(F.col("real_topics").isNull(), latest > F.col("decision_ms")).otherwise(
            F.exists(
                F.col("real_topics"),
                lambda t: F.coalesce(
                    F.try_element_at(since, t) > F.col("decision_ms"), F.lit(False)
                ),
            )
        )
    # its half records before what was read, its real topics are not known: the messages
    # missing from the topics read may be on others (they were reported lost)
    emptied = emptied | F.col("halves_unread")
    # a COMMIT the relay refused (dead-lettered) was never delivered, whatever the topics hold
    emptied = emptied & ~F.col("op_refused")
    return ledger.filter(judged & (~emptied if verifiable else emptied))


def unverifiable(
    ledger: DataFrame, *, as_of_ms: int, grace_ms: int, complete_since_ms: Mapping[str, int]
) -> DataFrame:
    """COMMITs with messages missing that :func:`lost` and :func:`partial` do not judge: a
    real topic of theirs has lost records decided before, or their real topics are not known
    (known from their op alone, their half records before what was read), so whether theirs
    arrived cannot be told. Counted in the summary, not a violation."""
    return _committed_past_grace(
        ledger, as_of_ms, grace_ms, complete_since_ms, verifiable=False
    ).filter(F.col("delivered") < F.col("expected"))


def _missing_indices() -> Column:
    wanted = F.sequence(F.lit(0), F.greatest(F.col("expected") - 1, F.lit(0)))
    wanted = F.when(F.col("expected") > 0, wanted).otherwise(F.array().cast("array<int>"))
    return F.array_except(wanted, F.col("delivered_indices")).alias("missing_indices")


def superseded(
    messages: DataFrame,
    promoted: DataFrame,
    ledger: DataFrame,
    compactable_before_ms: Mapping[str, int],
) -> DataFrame:
    """Per committed transaction, the indices of its messages to a compacted real topic whose
    key has a record there promoted at or after its COMMIT: the cleaner keeps only a key's
    latest record, so such a message may have arrived and been removed since - unless it was
    decided after the topic's ``compactable_before_ms`` (now minus ``min.compaction.lag.ms``:
    the cleaner leaves younger records alone, so a younger one missing never arrived).

    ``messages`` is :func:`checker.audit.ledger.messages`; a message whose key's latest record
    came before its COMMIT cannot have been replaced (its own would be the latest), and one
    whose key has no record left stays missing (a tombstone removed after
    ``delete.retention.ms`` takes the key with it: docs/audit.md).
    """
    compacted = sorted(compactable_before_ms)
    before = F.try_element_at(literal_map(compactable_before_ms), F.col("topic"))
    latest = (
        promoted.filter(F.col("topic").isin(*compacted) & F.col("key").isNotNull())
        .groupBy("topic", "key")
        .agg(F.max("ts_ms").alias("latest_ms"))
    )
    theirs = messages.filter(F.col("real_topic").isin(*compacted)).select(
        "txn_id",
        "message_index",
        F.col("real_topic").alias("topic"),
        F.col("real_key").alias("key"),
    )
    commits = ledger.filter(F.col("state") == COMMIT).select("txn_id", "decision_ms")
    return (
        theirs.join(commits, "txn_id")
        .join(latest, ["topic", "key"])
        .filter((F.col("latest_ms") >= F.col("decision_ms")) & (F.col("decision_ms") <= before))
        .groupBy("txn_id")
        .agg(F.array_sort(F.collect_set("message_index")).alias("superseded_indices"))
    )


def with_superseded(ledger: DataFrame, replaced: DataFrame) -> DataFrame:
    """``ledger`` with the messages of :func:`superseded` counted as delivered, for
    :func:`lost` and :func:`partial`."""
    indices = F.array_union(
        F.col("delivered_indices"),
        F.coalesce(F.col("superseded_indices"), F.array().cast("array<int>")),
    )
    valid = F.filter(indices, lambda i: (i >= 0) & (i < F.col("expected")))
    return (
        ledger.join(replaced, "txn_id", "left")
        .withColumn("delivered_indices", indices)
        .withColumn("delivered", F.size(F.array_distinct(valid)))
        .drop("superseded_indices")
    )


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


def phantom(
    promoted: DataFrame, ledger: DataFrame, *, unknown_since_ms: int | None = None
) -> DataFrame:
    """Records on real topics without a COMMIT behind them, one row per record.

    Records of transactions the half and op topics show began before the range are not judged;
    a record whose transaction neither topic shows (or only an op whose half records retention
    removed) is judged when it is itself in range and, where the op topic has lost records to
    retention, stamped at or after ``unknown_since_ms`` (when it holds every op again: an
    earlier record's op may have been removed).
    """
    records = _explained(promoted, ledger)
    judged = (F.col("unknown") & _shown(unknown_since_ms)) | F.coalesce(
        F.col("in_scope"), F.lit(False)
    )
    return records.filter(judged & F.col("reason").isNotNull()).select(
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


def unjudged_records(
    promoted: DataFrame, ledger: DataFrame, *, unknown_since_ms: int | None
) -> DataFrame:
    """Records in range that :func:`phantom` would report but for ``unknown_since_ms``: their
    transaction's half and op records may have been removed. Counted in the summary, not a
    violation."""
    records = _explained(promoted, ledger)
    if unknown_since_ms is None:
        return records.limit(0)
    left_out = F.col("in_range") & ~_shown(unknown_since_ms)
    return records.filter(F.col("unknown") & left_out & F.col("reason").isNotNull())


def _shown(unknown_since_ms: int | None) -> Column:
    shown = F.col("in_range")
    if unknown_since_ms is not None:
        shown = shown & (F.col("ts_ms") >= F.lit(unknown_since_ms))
    return shown


def _explained(promoted: DataFrame, ledger: DataFrame) -> DataFrame:
    """The outbox's records on real topics with what the ledger knows of their transaction:
    ``reason`` (null when a COMMIT covers the record) and ``unknown`` (neither topic shows the
    transaction, or only an op whose half records retention removed)."""
    known = ledger.select(
        "txn_id",
        "in_scope",
        "state",
        "decided_by",
        "decision_ms",
        "expected",
        "halves_removed",
        F.col("producer_group").alias("known_group"),
    )
    records = promoted.filter(F.col("txn_id").isNotNull()).join(known, "txn_id", "left")
    unknown = F.col("in_scope").isNull() | F.coalesce(F.col("halves_removed"), F.lit(False))
    beyond = (F.col("message_index") < 0) | (F.col("message_index") >= F.col("expected"))
    reason = (
        F.when(
            F.col("in_scope").isNull(), F.lit("no half or op record of this transaction was read")
        )
        .when(F.col("state").isNull(), F.lit("no decision"))
        .when(F.col("state") == OpState.RESUMED.value, F.lit("resumed, not decided again"))
        .when(F.col("state") != COMMIT, F.concat(F.lit("decided "), F.col("state")))
        .when(beyond, F.lit("message index past the committed message count"))
    )
    return records.withColumns({"reason": reason, "unknown": unknown})


def duplicate(delivered: DataFrame, ledger: DataFrame) -> DataFrame:
    """Messages of in-scope transactions found more than once on the real topics."""
    scope = ledger.filter(F.col("in_scope")).select("txn_id", "producer_group", "state")
    return (
        delivered.filter(F.col("times") > 1)
        .join(scope, "txn_id")
        .select("txn_id", "producer_group", "state", "message_index", "times", "records")
    )

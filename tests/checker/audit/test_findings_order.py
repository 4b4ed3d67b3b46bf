"""out of order: per key, promoted order must follow COMMIT-op order and message index."""

from __future__ import annotations

import random

import pytest
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from checker.audit.findings.order import out_of_order
from tests.checker.audit.scenario import Scenario, ids

pytestmark = pytest.mark.integration  # starts Spark (a JVM), no Kafka


def test_records_promoted_against_commit_order_or_index_order_are_reported(spark) -> None:
    sc = Scenario()
    # key a: committed first, second, third; promoted second, first, third
    first, second, third = (sc.txn(key=b"a") for _ in range(3))
    for t in (first, second, third):
        sc.op(t, "COMMIT", at=2_000)
    for t in (second, first, third):
        sc.promote(t, at=3_000)
    # key b: one transaction, its messages promoted in the wrong order
    reversed_txn = sc.txn(2, key=b"b")
    sc.op(reversed_txn, "COMMIT", at=2_000)
    sc.promote(reversed_txn, [1, 0], at=3_000)
    book, frames = sc.ledger(spark)

    found = out_of_order(frames["delivered"], book)

    assert ids(found) == {first.txn_id, reversed_txn.txn_id}
    late = found.filter(found.txn_id == first.txn_id).first()
    assert (late.after_txn_id, late.key) == (second.txn_id, "a")
    assert late.commit_offset < late.after_commit_offset


def test_in_order_streams_repeats_and_unrelated_streams_are_not_reported(spark) -> None:
    sc = Scenario()
    a1, a2 = sc.txn(key=b"a"), sc.txn(key=b"a")
    sc.op(a1, "COMMIT", at=2_000)
    sc.op(a2, "COMMIT", at=2_000)
    sc.promote(a1, at=3_000)
    sc.promote(a2, at=3_000)
    sc.promote(a1, at=4_000)  # a duplicate later is a duplicate, not disorder
    b_on_p0, b_on_p1 = sc.txn(key=b"b", partition=0), sc.txn(key=b"b", partition=1)
    sc.op(b_on_p1, "COMMIT", at=2_000)
    sc.op(b_on_p0, "COMMIT", at=2_000)
    sc.op(b_on_p0, "COMMIT", at=2_000)  # op partitions are not ordered against each other
    sc.promote(b_on_p1, at=3_000)
    sc.promote(b_on_p0, at=3_000)
    c1, c2 = sc.txn(key=b"c"), sc.txn(key=b"d")
    sc.op(c2, "COMMIT", at=2_000)
    sc.op(c1, "COMMIT", at=2_000)
    sc.promote(c1, at=3_000)  # different keys: no promise
    sc.promote(c2, at=3_000)
    book, frames = sc.ledger(spark)

    assert out_of_order(frames["delivered"], book).count() == 0


def _by_windows_over_the_records(promoted: DataFrame, ledger: DataFrame) -> DataFrame:
    """The finding as it was computed before it took each message's first copy from the
    deliveries (a second window over every promoted record): the reference it must equal."""
    committed = ledger.filter(F.col("in_scope") & (F.col("state") == "COMMIT")).select(
        "txn_id", "producer_group", "decision_partition", "decision_offset"
    )
    records = (
        promoted.filter(F.col("txn_id").isNotNull() & F.col("key").isNotNull())
        .drop("producer_group")
        .join(committed, "txn_id")
    )
    first = Window.partitionBy("txn_id", "message_index").orderBy("topic", "partition", "offset")
    firsts = records.withColumn("copy", F.row_number().over(first)).filter("copy = 1")
    stream = Window.partitionBy("topic", "partition", "key", "decision_partition").orderBy("offset")
    compared = firsts.withColumns(
        {
            "prev_txn_id": F.lag("txn_id").over(stream),
            "prev_index": F.lag("message_index").over(stream),
            "prev_offset": F.lag("offset").over(stream),
            "prev_commit_offset": F.lag("decision_offset").over(stream),
        }
    )
    behind = (F.col("prev_commit_offset") > F.col("decision_offset")) | (
        (F.col("prev_commit_offset") == F.col("decision_offset"))
        & (F.col("prev_index") > F.col("message_index"))
    )
    return compared.filter(behind).select(
        "txn_id", "producer_group", "topic", "partition", "offset", "ts_ms",
        F.col("key").cast("string").alias("key"), "message_index",
        F.col("decision_partition").alias("commit_partition"),
        F.col("decision_offset").alias("commit_offset"),
        F.col("prev_txn_id").alias("after_txn_id"), F.col("prev_offset").alias("after_offset"),
        F.col("prev_commit_offset").alias("after_commit_offset"),
    )  # fmt: skip


def test_the_first_copies_from_the_deliveries_give_the_records_windows_over_them_gave(
    spark,
) -> None:
    """Random streams: shuffled promotions, repeats (some with an earlier broker time than the
    first copy, some on another partition), keyless messages, rollbacks promoted anyway,
    transactions on two op partitions; the finding is compared with the query it replaced, row
    for row."""
    rng = random.Random(30)
    sc = Scenario()
    txns = []
    for n in range(160):
        keys = [rng.choice([b"a", b"b", b"c", None]) for _ in range(rng.randint(1, 3))]
        t = sc.txn(keys=keys, partition=n % 2)
        sc.op(t, rng.choice(["COMMIT", "COMMIT", "COMMIT", "ROLLBACK"]), at=2_000 + n)
        txns.append(t)
    rng.shuffle(txns)
    for t in txns:
        indices = list(range(len(t.keys)))
        if rng.random() < 0.3:
            rng.shuffle(indices)
        sc.promote(t, indices, at=3_000 + rng.randint(0, 500), partition=rng.randint(0, 1))
    for t in rng.sample(txns, 40):  # repeats, some "earlier" by broker time
        sc.promote(t, at=rng.choice([1_500, 9_000]), partition=rng.randint(0, 1))
    book, frames = sc.ledger(spark)

    found = out_of_order(frames["delivered"], book)
    reference = _by_windows_over_the_records(frames["promoted"], book)

    assert found.columns == reference.columns
    rows = sorted(tuple(r) for r in found.collect())
    assert rows == sorted(tuple(r) for r in reference.collect())
    assert len(rows) > 10  # the streams do disagree with their commit order

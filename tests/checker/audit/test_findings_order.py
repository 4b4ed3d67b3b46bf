"""out of order: per key, promoted order must follow COMMIT-op order and message index."""

from __future__ import annotations

import pytest

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

    found = out_of_order(frames["promoted"], book)

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

    assert out_of_order(frames["promoted"], book).count() == 0

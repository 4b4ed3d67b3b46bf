"""The ledger: copies folded into their message, decisions by epoch, scope by the first record."""

from __future__ import annotations

from typing import Any

import pytest

from checker.audit import ledger as L
from tests.checker.audit.scenario import Scenario

pytestmark = pytest.mark.integration  # starts Spark (a JVM), no Kafka


def row(book, txn_id: str):
    return book.filter(book.txn_id == txn_id).first()


def test_a_put_back_copy_is_never_a_second_message(spark) -> None:
    sc = Scenario()
    t = sc.txn(2, at=1_000)
    sc.put_back(t, 0, at=5_000)
    sc.put_back(t, 0, at=9_000)
    sc.op(t, "COMMIT", at=10_000)
    sc.promote(t, at=11_000)
    book, _ = sc.ledger(spark)

    found = row(book, t.txn_id)
    assert (found.messages_seen, found.copies, found.expected, found.delivered) == (2, 2, 2, 2)
    assert found.half_offsets == t.offsets  # the originals', never a copy's
    assert found.first_half_ms == 1_000
    assert found.in_scope


def test_the_first_terminal_op_after_the_latest_resumed_decides(spark) -> None:
    sc = Scenario()
    resumed_then_committed = sc.txn()
    for state, at in (("GIVEN_UP", 2_000), ("RESUMED", 3_000), ("COMMIT", 4_000)):
        sc.op(resumed_then_committed, state, at=at, by="checker")
    resumed_pending = sc.txn()
    sc.op(resumed_pending, "GIVEN_UP", at=2_000, by="checker")
    sc.op(resumed_pending, "RESUMED", at=3_000, by="checker")
    repeated = sc.txn()
    sc.op(repeated, "ROLLBACK", at=2_000)
    sc.op(repeated, "ROLLBACK", at=2_500, by="checker")
    sc.op(repeated, "COMMIT", at=2_600, by="checker")
    book, _ = sc.ledger(spark)

    first = row(book, resumed_then_committed.txn_id)
    assert (first.state, first.decision_ms) == ("COMMIT", 4_000)
    pending = row(book, resumed_pending.txn_id)
    assert (pending.state, pending.resumed_ms) == ("RESUMED", 3_000)
    again = row(book, repeated.txn_id)
    assert (again.state, again.decided_by, again.repeated_ops) == ("ROLLBACK", "producer", 2)


def test_scope_is_the_first_half_record_or_for_half_less_transactions_the_first_op(spark) -> None:
    sc = Scenario()
    before = sc.txn(in_range=False)
    sc.op(before, "COMMIT", at=2_000, in_range=True)
    inside = sc.txn(in_range=True)
    halves_gone = sc.txn()
    sc.halves = [h for h in sc.halves if h[0] != halves_gone.txn_id]
    sc.op(halves_gone, "COMMIT", at=2_000)
    copy_only = sc.txn()
    sc.put_back(copy_only, 0, at=3_000)
    sc.halves = [h for h in sc.halves if not (h[0] == copy_only.txn_id and h[7] is None)]
    book, _ = sc.ledger(spark)

    assert not row(book, before.txn_id).in_scope
    assert row(book, inside.txn_id).in_scope
    gone = row(book, halves_gone.txn_id)
    assert gone.in_scope and gone.expected == 1 and gone.half_offsets == halves_gone.offsets
    assert not row(book, copy_only.txn_id).in_scope


def test_a_transaction_is_answered_by_evidence_only_when_all_its_half_records_say_so(
    spark,
) -> None:
    sc = Scenario()
    plain = sc.txn(2)
    listener = sc.txn(2, check_by="listener")
    sc.put_back(listener, 0, at=3_000)
    mixed = sc.txn(2)
    sc.halves[-1] = (*sc.halves[-1][:-1], "listener")  # one record of two says listener
    halves_gone = sc.txn()
    sc.halves = [h for h in sc.halves if h[0] != halves_gone.txn_id]
    sc.op(halves_gone, "COMMIT", at=2_000)
    book, _ = sc.ledger(spark)

    assert row(book, plain.txn_id).check_by == "evidence"
    assert row(book, listener.txn_id).check_by == "listener"
    assert row(book, mixed.txn_id).check_by == "listener"
    assert row(book, halves_gone.txn_id).check_by is None  # not known: no half record read


def resumed_from_its_copy(sc: Scenario, t: Any) -> None:
    """``t`` given up, put back (one copy) and resumed; its original half records not read."""
    sc.op(t, "GIVEN_UP", at=2_000, by="checker")
    sc.put_back(t, 0, at=3_000)
    sc.op(t, "RESUMED", at=3_000, by="checker")
    sc.halves = [h for h in sc.halves if not (h[0] == t.txn_id and h[7] is None)]


def ledger_inputs(sc: Scenario, spark: Any) -> tuple[Any, Any, Any]:
    """The transactions, decisions and deliveries :func:`L.ledger` takes, from ``sc``."""
    frames = sc.frames(spark)
    txns = L.transactions(L.messages(frames["halves"]))
    return txns, L.decisions(frames["ops"]), L.deliveries(frames["promoted"])


def test_a_transaction_whose_half_records_retention_removed_is_out_of_scope(spark) -> None:
    """Known from its op alone, it is judged only while the half offsets its op names are still
    on the half topic: below the partition's log start, retention took them (and likely its
    real records): it began before anything the topics hold."""
    sc = Scenario()
    removed = sc.txn(partition=0)
    refused = sc.txn(partition=0)  # the relay dead-lettered its COMMIT: never delivered
    missing = sc.txn(partition=1)
    for t in (removed, refused, missing):
        sc.halves = [h for h in sc.halves if h[0] != t.txn_id]
        sc.op(t, "COMMIT", at=2_000)
    resumed = sc.txn(partition=0)
    resumed_from_its_copy(sc, resumed)
    txns, decided, delivered = ledger_inputs(sc, spark)
    starts = {0: max(resumed.offsets) + 1, 1: min(missing.offsets)}  # the copy is above

    letters = spark.createDataFrame([(refused.txn_id,)], "txn_id string")
    book = L.ledger(txns, decided, delivered, half_log_starts=starts, refused=letters)
    assert not row(book, removed.txn_id).in_scope
    assert row(book, removed.txn_id).halves_removed
    assert row(book, refused.txn_id).in_scope
    assert row(book, missing.txn_id).in_scope  # its offsets are still held: not retention
    assert row(book, resumed.txn_id).in_scope  # judged where it was resumed
    before = L.ledger(txns, decided, delivered)
    assert row(before, removed.txn_id).in_scope


def test_a_commit_whose_op_names_half_records_before_what_was_read_has_unknown_real_topics(
    spark,
) -> None:
    """Known from its op alone, with every half offset it names below the first offset read of
    their partition (or in a partition of which nothing was read): it began before what was
    read, and its real topics are not known. Judged from its op alone, its COMMIT used to be
    lost wherever no half record read named the same real topic."""
    sc = Scenario()
    began_before = sc.txn(partition=0)
    refused = sc.txn(partition=0)  # the relay dead-lettered its COMMIT: never delivered
    straddles = sc.txn(2, partition=0)  # its second record should have been read
    sc.txn(partition=0)  # read: its half records lie past the first offset read
    missing = sc.txn(partition=0)  # named at or past the first offset read, yet not there
    unread = sc.txn(partition=1)  # nothing of partition 1 was read
    for t in (began_before, refused, straddles, missing, unread):
        sc.halves = [h for h in sc.halves if h[0] != t.txn_id]
        sc.op(t, "COMMIT", at=2_000)
    # partition 2, read from across's second record: resumed's original lies before, its
    # copy after; across's first record before, its second read
    resumed = sc.txn(partition=2)
    across = sc.txn(2, partition=2)
    sc.halves = [h for h in sc.halves if not (h[0] == across.txn_id and h[4] == 0)]
    sc.op(across, "COMMIT", at=2_000)
    resumed_from_its_copy(sc, resumed)
    txns, decided, delivered = ledger_inputs(sc, spark)
    read_from = {0: max(straddles.offsets), 2: max(across.offsets)}

    letters = spark.createDataFrame([(refused.txn_id,)], "txn_id string")
    book = L.ledger(txns, decided, delivered, half_read_from=read_from, refused=letters)
    unread_ids = {r.txn_id for r in book.filter("halves_unread").collect()}
    assert unread_ids == {began_before.txn_id, unread.txn_id}
    # still in scope: judged for everything its op shows (decisions, evidence)
    assert all(row(book, t.txn_id).in_scope for t in (began_before, unread, missing))
    # its first half record before the range, its second read: out of scope (it was in, its
    # first message's real topic unknown, its COMMIT partial)
    assert not row(book, across.txn_id).in_scope
    assert row(L.ledger(txns, decided, delivered), across.txn_id).in_scope
    assert row(book, resumed.txn_id).in_scope  # judged where it was resumed
    assert L.ledger(txns, decided, delivered).filter("halves_unread").count() == 0

"""lost, partial, phantom, duplicate: exactly the seeded transactions, nothing else."""

from __future__ import annotations

import pytest

from checker.audit import ledger as L
from checker.audit.findings.delivery import (
    duplicate,
    lost,
    partial,
    phantom,
    superseded,
    unjudged_records,
    unverifiable,
    with_superseded,
)
from outbox.protocol.ids import new_transaction_id
from tests.checker.audit.scenario import Scenario, ids

pytestmark = pytest.mark.integration  # starts Spark (a JVM), no Kafka

AS_OF, GRACE = 100_000, 60_000


def test_lost_and_partial_are_committed_messages_missing_after_the_grace_period(spark) -> None:
    sc = Scenario()
    fine = sc.txn(2)
    sc.op(fine, "COMMIT", at=2_000)
    sc.promote(fine, at=3_000)
    gone = sc.txn(2)
    sc.op(gone, "COMMIT", at=2_000)
    half_there = sc.txn(3)
    sc.op(half_there, "COMMIT", at=2_000)
    sc.promote(half_there, [0, 2], at=3_000)
    recent = sc.txn()
    sc.op(recent, "COMMIT", at=AS_OF - GRACE + 1)
    declined = sc.txn()
    sc.op(declined, "ROLLBACK", at=2_000)
    earlier = sc.txn(in_range=False)
    sc.op(earlier, "COMMIT", at=2_000, in_range=False)
    book, _ = sc.ledger(spark)

    found_lost = lost(book, as_of_ms=AS_OF, grace_ms=GRACE)
    found_partial = partial(book, as_of_ms=AS_OF, grace_ms=GRACE)

    assert ids(found_lost) == {gone.txn_id}
    assert ids(found_partial) == {half_there.txn_id}
    assert found_lost.first().missing_indices == [0, 1]
    row = found_partial.first()
    assert (row.missing_indices, row.expected, row.delivered) == ([1], 3, 2)
    assert row.half_offsets == half_there.offsets and row.decision_ms == 2_000


def test_a_commit_naming_fewer_messages_than_its_halves_announce_leaves_the_rest_partial(
    spark,
) -> None:
    """A COMMIT naming two of three announced messages (written by a checker that held only
    those; the relay refuses it now, an older one promoted the two): the third is missing."""
    sc = Scenario()
    short = sc.txn(3)
    sc.op(short, "COMMIT", at=2_000, offsets=short.offsets[:2])
    sc.promote(short, [0, 1], at=3_000)
    refused = sc.txn(2)
    sc.op(refused, "COMMIT", at=2_000, offsets=refused.offsets[:1])
    book, _ = sc.ledger(spark)

    row = partial(book, as_of_ms=AS_OF, grace_ms=GRACE).first()
    assert row.txn_id == short.txn_id
    assert (row.missing_indices, row.expected, row.delivered) == ([2], 3, 2)
    found_lost = lost(book, as_of_ms=AS_OF, grace_ms=GRACE)
    assert ids(found_lost) == {refused.txn_id}
    assert found_lost.first().missing_indices == [0, 1]


def test_a_commit_naming_fewer_messages_than_its_halves_show_leaves_the_rest_missing(
    spark,
) -> None:
    """Half records sent one ``send()`` at a time announce no count, so only the indexes on the
    half topic say how many there were. A producer that took a delivery report without an
    offset for none wrote COMMITs naming fewer records than it had sent (one naming none at all,
    which the relay dead-letters); the three-broker fault test met it in CI and this audit said
    lost 0, because the count it expected was the COMMIT's."""
    sc = Scenario()
    none_named = sc.txn(1, announced=False)
    sc.op(none_named, "COMMIT", at=2_000, offsets=[])
    one_named = sc.txn(2, announced=False)
    sc.op(one_named, "COMMIT", at=2_000, offsets=one_named.offsets[:1])
    sc.promote(one_named, [0], at=3_000)
    whole = sc.txn(2, announced=False)
    sc.op(whole, "COMMIT", at=2_000)
    sc.promote(whole, at=3_000)
    book, _ = sc.ledger(spark)

    found_lost = lost(book, as_of_ms=AS_OF, grace_ms=GRACE)
    assert ids(found_lost) == {none_named.txn_id}
    assert found_lost.first().missing_indices == [0]
    row = partial(book, as_of_ms=AS_OF, grace_ms=GRACE).first()
    assert row.txn_id == one_named.txn_id
    assert (row.missing_indices, row.expected, row.delivered) == ([1], 2, 1)


def test_phantoms_are_records_without_a_commit_behind_them(spark) -> None:
    sc = Scenario()
    committed = sc.txn()
    sc.op(committed, "COMMIT", at=2_000)
    sc.promote(committed, at=3_000)
    rolled_back = sc.txn()
    sc.op(rolled_back, "ROLLBACK", at=2_000)
    sc.promote(rolled_back, at=3_000)
    given_up = sc.txn()
    sc.op(given_up, "GIVEN_UP", at=2_000, by="checker")
    sc.promote(given_up, at=3_000)
    undecided = sc.txn()
    sc.promote(undecided, at=3_000)
    past_count = sc.txn()
    sc.op(past_count, "COMMIT", at=2_000)
    sc.promote(past_count, at=3_000)
    sc.promoted.append(("orders", 0, 99, 3_000, b"k", past_count.txn_id, "g", 1, True))
    orphan, old_orphan = new_transaction_id(), new_transaction_id()
    sc.promoted.append(("orders", 0, 100, 3_000, b"k", orphan, "g", 0, True))
    sc.promoted.append(("orders", 0, 101, 3_000, b"k", old_orphan, "g", 0, False))
    earlier = sc.txn(in_range=False)
    sc.op(earlier, "ROLLBACK", at=2_000, in_range=False)
    sc.promote(earlier, at=3_000)
    sc.promoted.append(("orders", 0, 102, 3_000, b"k", None, None, None, True))  # not ours
    book, frames = sc.ledger(spark)

    found = phantom(frames["promoted"], book)

    reasons = {r.txn_id: r.reason for r in found.collect()}
    assert reasons == {
        rolled_back.txn_id: "decided ROLLBACK",
        given_up.txn_id: "decided GIVEN_UP",
        undecided.txn_id: "no decision",
        past_count.txn_id: "message index past the committed message count",
        orphan: "no half or op record of this transaction was read",
    }


def test_a_message_twice_on_the_real_topic_is_a_duplicate(spark) -> None:
    sc = Scenario()
    once = sc.txn(2)
    sc.op(once, "COMMIT", at=2_000)
    sc.promote(once, at=3_000)
    twice = sc.txn(2)
    sc.op(twice, "COMMIT", at=2_000)
    sc.promote(twice, at=3_000)
    sc.promote(twice, [1], at=4_000)
    earlier = sc.txn(in_range=False)
    sc.op(earlier, "COMMIT", at=2_000, in_range=False)
    sc.promote(earlier, at=3_000)
    sc.promote(earlier, at=3_000)
    book, frames = sc.ledger(spark)

    found = duplicate(frames["delivered"], book)

    assert ids(found) == {twice.txn_id}
    row = found.first()
    assert (row.message_index, row.times) == (1, 2)
    assert [r.ts_ms for r in row.records] == [3_000, 4_000]


@pytest.mark.parametrize("originals", ["before the window", "removed by retention"])
def test_what_follows_a_resume_in_the_window_is_judged_there(spark, originals: str) -> None:
    """The hourly audit reads the resume's copy and ops, not the transaction's first records
    (given up hours before, or gone with the half topic's retention). Before, such a
    transaction was out of scope: a resumed COMMIT never delivered, or a resumed ROLLBACK
    delivered anyway, was reported clean."""
    sc = Scenario()
    resumed: dict[str, object] = {}
    for name, decision, promoted in (("lost", "COMMIT", False), ("phantom", "ROLLBACK", True)):
        t = sc.txn(1, at=1_000, in_range=False)
        sc.op(t, "GIVEN_UP", at=20_000, by="checker", in_range=False)
        if originals == "removed by retention":
            sc.halves = [h for h in sc.halves if h[0] != t.txn_id]
        sc.put_back(t, 0, at=50_000)  # the resume's copy
        sc.op(t, "RESUMED", at=50_000, by="checker")
        sc.op(t, decision, at=51_000, by="checker")
        if promoted:
            sc.promote(t, at=52_000)
        resumed[name] = t.txn_id
    never_resumed = sc.txn(1, at=1_000, in_range=False)
    sc.op(never_resumed, "COMMIT", at=2_000, in_range=False)
    # begun in this window, resumed after it (before the audit ran): judged in the resume's
    # window, not here as well
    resumed_later = sc.txn(1, at=10_000)
    sc.op(resumed_later, "GIVEN_UP", at=20_000, by="checker")
    sc.put_back(resumed_later, 0, at=90_000, in_range=False)
    sc.op(resumed_later, "RESUMED", at=90_000, by="checker", in_range=False)
    sc.op(resumed_later, "COMMIT", at=91_000, by="checker", in_range=False)
    book, frames = sc.ledger(spark)

    assert ids(lost(book, as_of_ms=200_000, grace_ms=GRACE)) == {resumed["lost"]}
    assert ids(phantom(frames["promoted"], book)) == {resumed["phantom"]}


def test_lost_and_partial_judge_only_what_a_real_topic_held_in_full_when_decided(spark) -> None:
    """A real topic that lost its records up to 5_000 to retention shows nothing of what was
    decided before: neither lost nor partial (its records may have come and gone)."""
    sc = Scenario()
    before = sc.txn(topic="orders")
    sc.op(before, "COMMIT", at=4_000)
    half_before = sc.txn(2, topic="orders")
    sc.op(half_before, "COMMIT", at=4_500)
    sc.promote(half_before, [1], at=6_000)
    at_the_start = sc.txn(topic="orders")
    sc.op(at_the_start, "COMMIT", at=5_000)
    half_after = sc.txn(2, topic="orders")
    sc.op(half_after, "COMMIT", at=5_500)
    sc.promote(half_after, [0], at=6_000)
    elsewhere = sc.txn(topic="payments")
    sc.op(elsewhere, "COMMIT", at=4_000)
    book, _ = sc.ledger(spark)
    since = {"orders": 5_000}

    assert ids(lost(book, as_of_ms=AS_OF, grace_ms=GRACE, complete_since_ms=since)) == {
        at_the_start.txn_id,
        elsewhere.txn_id,
    }
    assert ids(partial(book, as_of_ms=AS_OF, grace_ms=GRACE, complete_since_ms=since)) == {
        half_after.txn_id
    }
    # without the bound, what retention took looks lost
    assert before.txn_id in ids(lost(book, as_of_ms=AS_OF, grace_ms=GRACE))
    assert half_before.txn_id in ids(partial(book, as_of_ms=AS_OF, grace_ms=GRACE))


def test_a_record_no_topic_explains_is_a_phantom_once_the_op_topic_holds_every_op(spark) -> None:
    """Where the op topic lost records to retention up to 3_000, a promoted record stamped
    before then may have had its half and op records removed: not judged; after, a phantom."""
    sc = Scenario()
    earlier, later = sc.txn(), sc.txn()
    for t, at in ((earlier, 2_000), (later, 3_000)):
        sc.halves = [h for h in sc.halves if h[0] != t.txn_id]
        sc.promote(t, at=at)
    book, frames = sc.ledger(spark)

    assert ids(phantom(frames["promoted"], book, unknown_since_ms=3_000)) == {later.txn_id}
    assert ids(phantom(frames["promoted"], book)) == {earlier.txn_id, later.txn_id}


def test_a_commit_known_from_its_op_alone_waits_for_every_real_topic_read(spark) -> None:
    """Its real topics are not known: any real topic read that lost records decided before
    it may have held its messages; counted as unverifiable, not lost."""
    sc = Scenario()
    early, late = sc.txn(), sc.txn()
    for t, at in ((early, 4_000), (late, 6_000)):
        sc.halves = [h for h in sc.halves if h[0] != t.txn_id]
        sc.op(t, "COMMIT", at=at)
    book, _ = sc.ledger(spark)
    since = {"orders": 1_000, "payments": 5_000}

    assert ids(lost(book, as_of_ms=AS_OF, grace_ms=GRACE, complete_since_ms=since)) == {late.txn_id}
    found = unverifiable(book, as_of_ms=AS_OF, grace_ms=GRACE, complete_since_ms=since)
    assert ids(found) == {early.txn_id}


def test_a_commit_whose_half_records_lie_before_what_was_read_is_unverifiable_not_lost(
    spark,
) -> None:
    """Its op names half offsets below the first offset read: its real topics are not known
    (the real topics read are those the half records read name), so its messages missing from
    the topics read may be on others. Its messages found there count as arrived."""
    sc = Scenario()
    elsewhere, arrived, refused = (sc.txn() for _ in range(3))
    partly = sc.txn(2)  # one message found on a topic read, the other perhaps elsewhere
    in_read = sc.txn()
    for t in (elsewhere, arrived, refused, partly):
        sc.halves = [h for h in sc.halves if h[0] != t.txn_id]
    for t in (elsewhere, arrived, refused, partly, in_read):
        sc.op(t, "COMMIT", at=2_000)
    sc.promote(arrived, at=3_000)
    sc.promote(partly, [0], at=3_000)
    frames = sc.frames(spark)
    letters = spark.createDataFrame([(refused.txn_id,)], "txn_id string")
    book = L.ledger(
        L.transactions(L.messages(frames["halves"])),
        L.decisions(frames["ops"]),
        L.deliveries(frames["promoted"]),
        half_read_from={0: min(in_read.offsets)},
        refused=letters,
    )

    # the relay dead-lettered its COMMIT: never delivered; in_read's records were read
    assert ids(lost(book, as_of_ms=AS_OF, grace_ms=GRACE)) == {refused.txn_id, in_read.txn_id}
    assert ids(partial(book, as_of_ms=AS_OF, grace_ms=GRACE)) == set()
    found = unverifiable(book, as_of_ms=AS_OF, grace_ms=GRACE, complete_since_ms={})
    assert ids(found) == {elsewhere.txn_id, partly.txn_id}


def test_records_of_a_rollback_whose_half_records_retention_removed_are_still_phantoms(
    spark,
) -> None:
    sc = Scenario()
    declined, committed, stranger = sc.txn(), sc.txn(), sc.txn()
    for t, state in ((declined, "ROLLBACK"), (committed, "COMMIT")):
        sc.op(t, state, at=2_000)
    sc.halves = []  # all removed by retention
    for t in (declined, committed, stranger):
        sc.promote(t, at=3_000)
    frames = sc.frames(spark)
    book = L.ledger(
        L.transactions(L.messages(frames["halves"])),
        L.decisions(frames["ops"]),
        L.deliveries(frames["promoted"]),
        half_log_starts={0: 100},
    )

    assert not row_of(book, declined.txn_id).in_scope
    assert ids(phantom(frames["promoted"], book)) == {declined.txn_id, stranger.txn_id}
    # stamped before the op topic holds every op again: not judged, counted
    assert ids(phantom(frames["promoted"], book, unknown_since_ms=3_001)) == set()
    counted = unjudged_records(frames["promoted"], book, unknown_since_ms=3_001)
    assert ids(counted) == {declined.txn_id, stranger.txn_id}


def test_a_compacted_topic_replaces_only_records_older_than_its_compaction_lag(spark) -> None:
    sc = Scenario()
    old = sc.txn(key=b"c1", topic="customers")
    sc.op(old, "COMMIT", at=2_000)
    young = sc.txn(key=b"c2", topic="customers")
    sc.op(young, "COMMIT", at=8_000)
    stale = sc.txn(key=b"c3", topic="customers")
    sc.op(stale, "COMMIT", at=2_000)
    for t, at in (
        (sc.txn(key=b"c1", topic="customers"), 3_000),
        (sc.txn(key=b"c2", topic="customers"), 9_000),
        (sc.txn(key=b"c3", topic="customers"), 1_500),
    ):
        sc.op(t, "COMMIT", at=at - 500)
        sc.promote(t, at=at)
    book, frames = sc.ledger(spark)
    messages = L.messages(frames["halves"])

    # the cleaner may have replaced records older than 5_000 only
    replaced = superseded(messages, frames["promoted"], book, {"customers": 5_000})
    arrived = with_superseded(book, replaced)
    assert ids(lost(arrived, as_of_ms=AS_OF, grace_ms=GRACE)) == {young.txn_id, stale.txn_id}
    assert old.txn_id in ids(replaced)  # (and the helpers, each its key's latest record)
    assert not {young.txn_id, stale.txn_id} & ids(replaced)


def row_of(book, txn_id: str):
    return book.filter(book.txn_id == txn_id).first()

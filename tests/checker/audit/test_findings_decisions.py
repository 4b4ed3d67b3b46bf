"""stuck, given up, conflicting decisions: exactly the seeded transactions, nothing else."""

from __future__ import annotations

import pytest

from checker.audit.findings.decisions import conflicting_decisions, given_up, stuck
from tests.checker.audit.scenario import Scenario, ids

pytestmark = pytest.mark.integration  # starts Spark (a JVM), no Kafka

AS_OF, WINDOW = 1_000_000, 456_000


def test_stuck_is_undecided_for_longer_than_the_check_window(spark) -> None:
    sc = Scenario()
    old = sc.txn(at=AS_OF - WINDOW - 1)
    sc.put_back(old, 0, at=AS_OF - 1_000)  # a copy does not restart the clock
    young = sc.txn(at=AS_OF - WINDOW + 1_000)
    decided = sc.txn(at=1_000)
    sc.op(decided, "ROLLBACK", at=2_000)
    resumed_long_ago = sc.txn(at=1_000)
    sc.op(resumed_long_ago, "GIVEN_UP", at=2_000, by="checker")
    sc.op(resumed_long_ago, "RESUMED", at=3_000, by="checker")
    resumed_lately = sc.txn(at=1_000)
    sc.op(resumed_lately, "GIVEN_UP", at=2_000, by="checker")
    sc.op(resumed_lately, "RESUMED", at=AS_OF - 5_000, by="checker")
    before = sc.txn(at=1_000, in_range=False)
    book, _ = sc.ledger(spark)

    found = stuck(book, as_of_ms=AS_OF, window_ms=WINDOW)

    rows = {r.txn_id: r for r in found.collect()}
    assert set(rows) == {old.txn_id, resumed_long_ago.txn_id}
    assert rows[old.txn_id].state == "UNDECIDED"
    assert rows[old.txn_id].age_ms == WINDOW + 1 and rows[old.txn_id].copies == 1
    assert rows[resumed_long_ago.txn_id].state == "RESUMED"
    assert young.txn_id not in rows and before.txn_id not in rows


def test_given_up_transactions_are_reported_with_their_dead_letters(spark) -> None:
    sc = Scenario()
    parked = sc.txn(2)
    sc.op(parked, "GIVEN_UP", at=5_000, by="checker", reason="still UNKNOWN after 15 checks")
    sc.dead_letter(parked, "still UNKNOWN after 15 checks", at=5_000)
    resumed = sc.txn()
    sc.op(resumed, "GIVEN_UP", at=5_000, by="checker")
    sc.op(resumed, "RESUMED", at=6_000, by="checker")
    sc.op(resumed, "COMMIT", at=7_000, by="checker")
    book, frames = sc.ledger(spark)

    found = given_up(book, frames["dead_letters"])

    assert ids(found) == {parked.txn_id}
    row = found.first()
    assert (row.dead_lettered, row.reason, row.decided_by) == (
        2,
        "still UNKNOWN after 15 checks",
        "checker",
    )


def test_two_different_terminal_ops_conflict_but_repeats_and_resumes_do_not(spark) -> None:
    sc = Scenario()
    flipped = sc.txn()
    sc.op(flipped, "COMMIT", at=2_000)
    sc.op(flipped, "ROLLBACK", at=3_000, by="checker")
    repeated = sc.txn()
    sc.op(repeated, "COMMIT", at=2_000)
    sc.op(repeated, "COMMIT", at=3_000, by="checker")
    resumed = sc.txn()
    for state in ("GIVEN_UP", "RESUMED", "COMMIT"):
        sc.op(resumed, state, at=4_000, by="checker")
    resumed_after_commit = sc.txn()
    sc.op(resumed_after_commit, "COMMIT", at=2_000)
    sc.op(resumed_after_commit, "RESUMED", at=3_000, by="checker")
    flipped_after_resume = sc.txn()
    for state in ("GIVEN_UP", "RESUMED", "ROLLBACK", "COMMIT"):
        sc.op(flipped_after_resume, state, at=4_000, by="checker")
    earlier = sc.txn(in_range=False)
    sc.op(earlier, "COMMIT", at=2_000, in_range=False)
    sc.op(earlier, "ROLLBACK", at=3_000, in_range=False)
    book, frames = sc.ledger(spark)

    found = conflicting_decisions(frames["ops"], book)

    pairs = {(r.txn_id, r.first_state, r.conflicting_state) for r in found.collect()}
    assert pairs == {
        (flipped.txn_id, "COMMIT", "ROLLBACK"),
        (resumed_after_commit.txn_id, "COMMIT", "RESUMED"),
        (flipped_after_resume.txn_id, "ROLLBACK", "COMMIT"),
    }

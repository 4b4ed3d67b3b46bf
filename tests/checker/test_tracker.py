"""The checker's pure parts: when a transaction is due, and when a group's checks pause."""

from __future__ import annotations

from dataclasses import replace

import pytest

from checker.breaker import Breaker
from checker.tracker import Tracker
from outbox.protocol import HalfMessage, HalfRecord, OpState

TXN = "01a203d8-301f-7701-b6f4-468000000001"


def half(offset: int, broker_ms: int, immunity_s: int | None = None) -> HalfRecord:
    return HalfRecord(
        txn_id=TXN,
        producer_group="g",
        message=HalfMessage("t", b"v"),
        index=offset,
        count=None,
        created_at_ms=999_999_999_999,  # a producer clock far off: must not matter
        check_count=0,
        check_immunity_s=immunity_s,
        partition=0,
        offset=offset,
        timestamp_ms=broker_ms,
    )


def test_first_check_is_due_a_timeout_after_the_broker_timestamp() -> None:
    tracker = Tracker(timeout_ms=6000, interval_ms=30_000)
    tracker.add_half(half(0, broker_ms=1_000))
    assert tracker.due(6_999) == []
    assert [p.txn_id for p in tracker.due(7_000)] == [TXN]


def test_decisions_are_forgotten_once_older_than_the_floor_a_restart_reads_from() -> None:
    tracker = Tracker(timeout_ms=6000, interval_ms=30_000, slack_ms=1_000)
    other = "01a203d8-301f-7701-b6f4-468000000002"
    tracker.decide(other, OpState.COMMIT, 0, ts_ms=5_000)  # read before its halves
    tracker.add_half(half(0, broker_ms=10_000))  # pending: the floor is its first record
    assert tracker.floor_ms(0) == 10_000 and tracker.half_floor(0, read_position=99) == 0
    assert tracker.prune() == 1 and other not in tracker.decided
    tracker.decide(TXN, OpState.COMMIT, 0, ts_ms=10_500)
    # nothing pending: the floor is the last half read; a decision that young is kept
    assert tracker.floor_ms(0) == 10_000 and tracker.half_floor(0, read_position=99) == 99
    assert tracker.prune() == 0 and TXN in tracker.decided


def test_a_copy_of_a_transaction_not_pending_here_makes_no_entry() -> None:
    tracker = Tracker(timeout_ms=6000, interval_ms=30_000)
    tracker.add_half(replace(half(0, broker_ms=1_000), offset=70, origin_offset=3))
    assert tracker.pending == {}
    # nor when the session read the partition from its committed offset, which lies past the
    # original (read by an earlier session, which never commits past a pending one), or at it
    for committed, first_read in [(10, 10), (3, 3), (-1001, 0)]:
        tracker = Tracker(timeout_ms=6000, interval_ms=30_000)
        tracker.reading_from(0, committed)
        tracker.add_half(replace(half(first_read, broker_ms=500), txn_id="other"))
        tracker.add_half(replace(half(0, broker_ms=1_000), offset=70, origin_offset=3))
        assert TXN not in tracker.pending, (committed, first_read)


def copy_of(origin: int, offset: int, broker_ms: int, index: int = 0) -> HalfRecord:
    return replace(half(index, broker_ms), offset=offset, origin_offset=origin)


@pytest.mark.parametrize("committed", [-1001, 0, 2], ids=["new-group", "from-0", "below-it"])
def test_a_copy_whose_original_retention_removed_unread_is_taken_up(committed: int) -> None:
    # Given a session that started below the log start (the first record it read is at 50)
    tracker = Tracker(timeout_ms=6000, interval_ms=30_000, slack_ms=1_000)
    tracker.reading_from(0, committed)
    tracker.add_half(replace(half(50, broker_ms=40_000), txn_id="other", offset=50))
    tracker.decide("other", OpState.COMMIT, 0, ts_ms=41_000)
    # When it reads the copies of a transaction whose originals (3 and 4) are gone
    tracker.add_half(copy_of(origin=3, offset=70, broker_ms=90_000))
    tracker.add_half(copy_of(origin=4, offset=71, broker_ms=90_000, index=1))
    tracker.read_to_end(0)
    # Then the transaction is pending, once, naming its originals
    [made] = tracker.pending.values()
    assert made.offsets == [3, 4] and made.orphaned and not made.reported
    # its time the first record read, older than the copy: decisions a later copy may need
    # are re-read from there, and it is due a timeout after it
    assert made.first_ms == 40_000 and tracker.floor_ms(0) == 40_000
    assert [p.txn_id for p in tracker.due(46_000)] == [TXN]
    # and the committed half offset goes back to its original, so that a restart - reading
    # from the log start again - takes it up again
    assert tracker.half_floor(0, read_position=99) == 3
    restarted = Tracker(timeout_ms=6000, interval_ms=30_000)
    restarted.reading_from(0, tracker.half_floor(0, read_position=99))
    restarted.add_half(replace(half(60, broker_ms=50_000), txn_id="other", offset=60))
    restarted.add_half(copy_of(origin=3, offset=70, broker_ms=90_000))
    assert restarted.pending[TXN].orphaned
    # A decision read for it ends it as for any other
    assert tracker.decide(TXN, OpState.COMMIT, 0, ts_ms=95_000) is made
    assert tracker.half_floor(0, read_position=99) == 99


def test_a_session_catching_up_past_a_gap_commits_no_further_until_read_to_the_end() -> None:
    # Given a session started at committed offset 2, below the log start (first read: 50)
    tracker = Tracker(timeout_ms=6000, interval_ms=30_000, slack_ms=1_000)
    tracker.reading_from(0, 2)
    assert tracker.half_floor(0, read_position=5) == 2  # nothing read yet
    tracker.add_half(replace(half(50, broker_ms=40_000), txn_id="other", offset=50))
    tracker.decide("other", OpState.COMMIT, 0, ts_ms=41_000)
    tracker.add_half(replace(half(58, broker_ms=55_000), txn_id="later", offset=58))
    tracker.decide("later", OpState.COMMIT, 0, ts_ms=56_000)
    # When it commits before it has read the copies (a restart, a rebalance, 5 s passing)
    # Then the committed offset stays where it was, and the floor at the first record read
    assert tracker.half_floor(0, read_position=60) == 2
    assert tracker.floor_ms(0) == 40_000
    # so a restart from there still takes up a copy whose original (3) is gone
    restarted = Tracker(timeout_ms=6000, interval_ms=30_000)
    restarted.reading_from(0, tracker.half_floor(0, read_position=60))
    restarted.add_half(replace(half(55, broker_ms=45_000), txn_id="other", offset=55))
    restarted.add_half(copy_of(origin=3, offset=70, broker_ms=90_000))
    assert restarted.pending[TXN].orphaned
    # while this session's own reading forgets decisions older than its last record read
    assert tracker.prune() == 1 and set(tracker.decided) == {"later"}
    # Once read to its end, the position moves on as always
    tracker.read_to_end(0)
    assert tracker.half_floor(0, read_position=60) == 60
    assert tracker.floor_ms(0) == 55_000  # the last half read
    # and a session whose first record is its committed offset holds nothing back
    trusted = Tracker(timeout_ms=6000, interval_ms=30_000)
    trusted.reading_from(0, 50)
    trusted.add_half(replace(half(50, broker_ms=40_000), txn_id="other", offset=50))
    trusted.decide("other", OpState.COMMIT, 0, ts_ms=41_000)
    assert trusted.half_floor(0, read_position=60) == 60


def test_a_copy_of_a_decided_transaction_is_not_taken_up_even_with_its_original_gone() -> None:
    tracker = Tracker(timeout_ms=6000, interval_ms=30_000)
    tracker.reading_from(0, -1001)
    tracker.decide(TXN, OpState.ROLLBACK, 0, ts_ms=30_000)
    tracker.add_half(copy_of(origin=3, offset=70, broker_ms=20_000))
    assert tracker.pending == {}


def test_a_partition_given_up_forgets_where_its_session_started() -> None:
    tracker = Tracker(timeout_ms=6000, interval_ms=30_000)
    tracker.reading_from(0, -1001)
    tracker.add_half(replace(half(50, broker_ms=1), txn_id="other", offset=50))
    tracker.drop_partition(0)
    # reassigned with no reading_from (or not yet): a copy is a decided one's
    tracker.add_half(copy_of(origin=3, offset=70, broker_ms=2))
    assert tracker.pending == {}


def test_a_restored_check_count_goes_to_its_transaction_and_stale_ones_are_named() -> None:
    from outbox.protocol.state import CheckCount

    tracker = Tracker(timeout_ms=6000, interval_ms=30_000)
    stale = "01a203d8-301f-7701-b6f4-468000000009"
    tracker.restored = {TXN: (0, CheckCount(4, 123)), stale: (0, CheckCount(1))}
    tracker.add_half(half(0, broker_ms=1_000))
    assert (tracker.pending[TXN].checks, tracker.pending[TXN].unreachable_since_ms) == (4, 123)
    assert tracker.stale_counts(0) == [stale] and tracker.restored == {}


def test_check_immunity_delays_the_first_check() -> None:
    tracker = Tracker(timeout_ms=6000, interval_ms=30_000)
    tracker.add_half(half(0, broker_ms=0, immunity_s=60))
    assert tracker.due(59_999) == []
    assert len(tracker.due(60_000)) == 1


def test_unknown_answers_count_and_reschedule_but_unreachable_ones_do_not_count() -> None:
    tracker = Tracker(timeout_ms=0, interval_ms=30_000)
    tracker.add_half(half(0, broker_ms=0))
    [entry] = tracker.due(0)
    tracker.unknown(entry, now_ms=10)
    assert (entry.checks, entry.due_ms) == (1, 30_010)
    assert tracker.unreachable(entry, now_ms=40_000) == 0
    assert tracker.unreachable(entry, now_ms=50_000) == 10_000
    assert entry.checks == 1


def test_first_terminal_op_wins_and_later_ones_are_counted() -> None:
    tracker = Tracker(timeout_ms=0, interval_ms=1)
    tracker.add_half(half(0, broker_ms=0))
    assert tracker.decide(TXN, OpState.COMMIT, 0, 1) is not None
    assert tracker.decide(TXN, OpState.COMMIT, 0, 2) is None
    assert tracker.decide(TXN, OpState.ROLLBACK, 0, 3) is None
    decided = tracker.decided[TXN].state
    assert (decided, tracker.duplicates, tracker.conflicts) == (OpState.COMMIT, 1, 1)
    tracker.add_half(half(1, broker_ms=0))  # a half read again after its decision
    assert tracker.pending == {}


def test_this_checkers_own_decision_read_back_is_no_duplicate() -> None:
    tracker = Tracker(timeout_ms=0, interval_ms=1)
    tracker.add_half(half(0, broker_ms=0))
    assert tracker.wrote(TXN, OpState.COMMIT, 0, 1) is not None
    assert tracker.decide(TXN, OpState.COMMIT, 0, 2) is None  # read back
    assert tracker.decide(TXN, OpState.COMMIT, 0, 3) is None  # another checker's, say
    assert (tracker.duplicates, tracker.conflicts, tracker.written) == (1, 0, {})


def test_a_decision_read_back_after_its_partition_came_back_decides_what_was_read_again() -> None:
    # Given a decision written, its partition revoked before the op was read back, then given
    # back, and the transaction's half read again from the committed position (a transaction
    # pending before it held that position back)
    tracker = Tracker(timeout_ms=0, interval_ms=1)
    tracker.add_half(half(0, broker_ms=0))
    tracker.wrote(TXN, OpState.GIVEN_UP, 0, 1)
    tracker.drop_partition(0)
    tracker.reading_from(0, 0)
    tracker.add_half(half(0, broker_ms=0))
    assert TXN in tracker.pending
    # When the decision is read back
    entry = tracker.decide(TXN, OpState.GIVEN_UP, 0, 2)
    # Then it decides the transaction read again (before, it was taken for a decision still
    # known here and swallowed: the transaction was asked about and decided a second time,
    # its records dead-lettered twice)
    assert entry is not None and tracker.pending == {} and tracker.due(10**9) == []
    assert (tracker.duplicates, tracker.conflicts) == (0, 0)


def test_breaker_opens_on_a_storm_of_bad_outcomes_and_closes_after_cooldown() -> None:
    breaker = Breaker(window=10, min_samples=5, threshold=0.8, cooldown_s=30)
    assert not any(breaker.record(False, now=0) for _ in range(5))
    assert not any(breaker.record(True, now=1) for _ in range(3))  # 3 of 8 bad
    assert [breaker.record(True, now=2) for _ in range(5)][-1] is True  # 8 of 10 bad
    assert not breaker.allows(now=31)
    assert breaker.allows(now=32)
    assert breaker.trips == 1


def test_metrics_and_probes_are_served_on_the_http_port() -> None:
    import urllib.error
    import urllib.request

    from checker import Checker, CheckerSettings
    from checker.metrics import serve
    from outbox.testing.ports import free_port

    checker = Checker(CheckerSettings(bootstrap_servers="unused:9092", insecure_local=True))
    checker.stats.given_up = 2
    checker.tracker.add_half(half(0, broker_ms=0))
    port = free_port()
    endpoint = serve(checker, port, host="127.0.0.1")
    base = f"http://127.0.0.1:{port}"
    try:
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as response:
            text = response.read().decode()
        with urllib.request.urlopen(f"{base}/healthz", timeout=5) as response:
            assert response.status == 200
        # not running yet: not ready, with the reason
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{base}/readyz", timeout=5)
        assert refused.value.code == 503 and b"starting" in refused.value.read()
    finally:
        endpoint.close()
    assert "outbox_checker_given_up_total 2.0" in text
    assert "outbox_checker_pending 1.0" in text


def test_copies_of_a_half_record_add_nothing_and_ops_name_the_original_offsets() -> None:
    tracker = Tracker(timeout_ms=6_000, interval_ms=30_000)
    tracker.add_half(half(0, broker_ms=0))
    original = tracker.pending[TXN].records[0]
    copy = replace(original, offset=original.offset + 50, origin_offset=original.offset)
    tracker.add_half(copy)
    entry = tracker.pending[TXN]
    assert len(entry.records) == 1 and entry.offsets == [original.offset]


def test_a_resumed_transaction_is_checked_again_from_a_count_of_zero() -> None:
    tracker = Tracker(timeout_ms=6_000, interval_ms=30_000)
    tracker.add_half(half(0, broker_ms=0))
    tracker.decide(TXN, OpState.GIVEN_UP, 0, 1)
    assert TXN not in tracker.pending
    tracker.resume(TXN, "g", 0, (9,), at_ms=100_000)
    entry = tracker.pending[TXN]
    assert entry.checks == 0 and entry.due_ms == 106_000 and entry.resumed_offsets == (9,)
    tracker.add_half(replace(half(0, broker_ms=100_000), offset=9, origin_offset=0))
    assert entry.offsets == [0]
    # and its next terminal op decides it, with no conflict counted
    tracker.decide(TXN, OpState.COMMIT, 0, 2)
    assert tracker.conflicts == 0 and TXN not in tracker.pending

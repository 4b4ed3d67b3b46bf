"""The relay's decision logic, without Kafka."""

from __future__ import annotations

from collections.abc import Callable

from outbox.protocol import DecidedBy, HalfMessage, HalfRecord, OpRecord, OpState
from relay.actions import BadRecord, Batch, Drop, Need, Promote, PutBack, Reject, Remember
from relay.progress import Progress
from relay.rebuild import apply_history, restore
from relay.state import PartitionState
from relay.whole import Promotable

TXN = [f"01a203d8-301f-7701-b6f4-{468000000000 + i}" for i in range(1000)]
HOUR_MS = 3_600_000


def half(
    txn: int,
    offset: int,
    index: int = 0,
    *,
    ts: int = 0,
    origin: int | None = None,
    count: int | None = None,
) -> HalfRecord:
    return HalfRecord(
        txn_id=TXN[txn],
        producer_group="g",
        message=HalfMessage(topic="orders", value=f"{txn}/{index}".encode(), key=b"k"),
        index=index,
        count=count,
        created_at_ms=0,
        check_count=0,
        origin_offset=origin,
        partition=0,
        offset=offset,
        timestamp_ms=ts,
    )


def op(txn: int, state: OpState, offsets: tuple[int, ...], at: int = -1) -> OpRecord:
    return OpRecord(
        txn_id=TXN[txn],
        state=state,
        producer_group="g",
        half_partition=0,
        half_offsets=offsets,
        decided_by=DecidedBy.PRODUCER,
        decided_at_ms=0,
        offset=at,
    )


def take(
    state: PartitionState,
    *,
    now: int = 0,
    fetch: Callable[[tuple[int, ...]], list[HalfRecord] | None] | None = None,
    promotable: Promotable | None = None,
    put_back_after: int = HOUR_MS,
    verified_end: int | None = None,
) -> Batch:
    """``take`` until it hands out a batch, answering each Need with ``fetch``."""
    while True:
        kwargs = {"promotable": promotable} if promotable else {}
        result = state.take(
            now, put_back_after_ms=put_back_after, verified_end=verified_end, **kwargs
        )
        if isinstance(result, Batch):
            return result
        assert fetch is not None, f"unexpected {result}"
        state.supply(result.txn_id, fetch(result.offsets))


def kinds(batch: Batch) -> list[type]:
    return [type(a) for a in batch.actions]


def test_commit_promotes_the_messages_in_index_order() -> None:
    state = PartitionState(0)
    state.add_half(half(0, 0, index=0))
    state.add_half(half(0, 1, index=1))
    state.add_op(0, op(0, OpState.COMMIT, (0, 1), at=0))
    batch = take(state)
    [action] = batch.actions
    assert isinstance(action, Promote)
    assert [r.index for r in action.records] == [0, 1]
    assert (batch.half_offset, batch.op_offset) == (2, 1)


def test_rollback_and_given_up_drop_the_messages() -> None:
    state = PartitionState(0)
    state.add_half(half(0, 0))
    state.add_half(half(1, 1))
    state.add_op(0, op(0, OpState.ROLLBACK, (0,), at=0))
    state.add_op(1, op(1, OpState.GIVEN_UP, (1,), at=1))
    assert kinds(take(state)) == [Drop, Drop]
    assert state.pending_records == 0 and state.counters.dropped == 2 and state.held == 0


def test_an_op_read_before_its_halves_waits_and_later_promotes() -> None:
    state = PartitionState(0)
    state.add_op(0, op(0, OpState.COMMIT, (0,), at=0))
    batch = take(state)
    assert batch.actions == [] and (batch.half_offset, batch.op_offset) == (0, 0)
    state.add_half(half(0, 0))
    assert kinds(take(state)) == [Promote]


def test_commits_on_one_partition_are_promoted_in_op_order_not_half_order() -> None:
    state = PartitionState(0)
    # txn 1's half comes first on the half partition, but txn 0 committed first
    state.add_half(half(1, 0))
    state.add_op(0, op(0, OpState.COMMIT, (1,), at=0))
    state.add_op(1, op(1, OpState.COMMIT, (0,), at=1))
    assert take(state).actions == []  # txn 0 waits for its half; txn 1 must not overtake it
    state.add_half(half(0, 1))
    assert [a.op.txn_id for a in take(state).actions] == [TXN[0], TXN[1]]  # type: ignore[union-attr]


def test_committed_half_offset_never_passes_an_undecided_half() -> None:
    state = PartitionState(0)
    state.add_half(half(0, 0))  # undecided
    for i in range(1, 5):
        state.add_half(half(i, i))
        state.add_op(i - 1, op(i, OpState.COMMIT, (i,), at=i - 1))
    batch = take(state)
    assert len(batch.actions) == 4
    assert (batch.half_offset, batch.op_offset) == (0, 4)
    # the rebuild must re-learn decisions from where the pending one was read
    assert Progress.parse(0, 4, batch.metadata).rebuild_from == 0
    state.add_op(4, op(0, OpState.ROLLBACK, (0,), at=4))
    batch = take(state)
    assert (batch.half_offset, batch.op_offset) == (5, 5)
    assert Progress.parse(5, 5, batch.metadata).rebuild_from == 5


def test_halves_of_transactions_decided_before_a_restart_are_not_pending() -> None:
    progress = Progress(half_offset=0, op_offset=3, rebuild_from=0)
    state = restore(progress, [op(0, OpState.COMMIT, (0,), at=0)], partition=0, log_end=2)
    state.add_half(half(0, 0))
    state.add_half(half(1, 1))
    assert state.pending_records == 1
    batch = take(state)
    assert (batch.half_offset, batch.op_offset) == (1, 3)


def test_repeated_and_conflicting_ops_are_counted_and_ignored() -> None:
    state = PartitionState(0)
    state.add_half(half(0, 0))
    state.add_op(0, op(0, OpState.COMMIT, (0,), at=0))
    state.add_op(1, op(0, OpState.COMMIT, (0,), at=1))
    state.add_op(2, op(0, OpState.ROLLBACK, (0,), at=2))
    batch = take(state)
    assert kinds(batch) == [Promote]
    # the reader had passed the partition's end: nothing remembered, repeats told by position
    assert state.counters.repeats == 2 and not state.decided
    assert (batch.half_offset, batch.op_offset) == (1, 3)


def test_while_the_reader_lags_a_repeat_is_told_a_duplicate_or_a_conflict() -> None:
    state = PartitionState(0)
    state.add_half(half(0, 0))
    state.add_op(0, op(0, OpState.COMMIT, (0,), at=0))
    state.add_op(1, op(0, OpState.COMMIT, (0,), at=1))
    state.add_op(2, op(0, OpState.ROLLBACK, (0,), at=2))
    batch = state.take(0, put_back_after_ms=HOUR_MS, log_end=50)
    assert isinstance(batch, Batch) and kinds(batch) == [Promote]
    assert (state.counters.duplicates, state.counters.conflicts) == (1, 1)
    for offset in range(1, 50):  # the reader reaches the end known at the decision
        state.add_half(half(1, offset))
    state.take(0, put_back_after_ms=HOUR_MS, log_end=50)
    assert not state.decided


def test_a_commit_for_halves_before_the_committed_half_offset_is_a_repeat() -> None:
    """The committed half offset never passes a pending record: a restarted relay given a
    COMMIT naming records before it, for a transaction it does not find pending, is given
    a transaction decided before. Nothing is fetched, nothing promoted again."""
    state = restore(Progress(half_offset=5, op_offset=0), [], partition=0, log_end=5)
    state.add_op(0, op(0, OpState.COMMIT, (1, 2), at=0))

    def fetch(offsets: tuple[int, ...]) -> list[HalfRecord]:
        raise AssertionError(f"fetched {offsets}")

    batch = take(state, fetch=fetch, verified_end=10)
    assert batch.actions == [] and batch.op_offset == 1 and state.counters.repeats == 1


def test_a_commit_naming_an_undecodable_half_is_not_promoted_and_the_relay_goes_on() -> None:
    state = PartitionState(0)
    state.add_bad(  # e.g. an undecodable record at offset 0
        BadRecord("__outbox-half", 0, 0, None, b"junk", (), "bad"), half=True
    )
    state.add_half(half(1, 1))
    state.add_op(0, op(0, OpState.COMMIT, (0,), at=0))
    state.add_op(1, op(1, OpState.COMMIT, (1,), at=1))
    batch = take(state, fetch=lambda offsets: None)
    # the undecodable record is dead-lettered with its reason; its transaction was never
    # pending, so its COMMIT counts as a repeat
    assert kinds(batch) == [BadRecord, Promote] and state.counters.repeats == 1


def test_an_op_naming_offsets_past_the_end_of_the_partition_is_rejected() -> None:
    state = PartitionState(0)
    state.add_op(0, op(0, OpState.COMMIT, (7,), at=0))
    assert take(state).actions == []  # waits: the halves may still be coming
    batch = take(state, verified_end=3)  # the broker says the partition ends at 3
    [reject] = batch.actions
    assert isinstance(reject, Reject) and "past the end" in reject.reason
    assert batch.op_offset == 1


def test_a_commit_naming_fewer_records_than_their_message_count_is_rejected_whole() -> None:
    """Half records carrying a count of 3 under a COMMIT naming two of them (a checker that held
    only those): promoting the two would deliver part of the transaction."""
    state = PartitionState(0)
    for offset, index in ((0, 0), (1, 1), (2, 2)):
        state.add_half(half(0, offset, index, count=3))
    state.add_half(half(1, 3, count=1))
    state.add_op(0, op(0, OpState.COMMIT, (0, 1), at=0))
    state.add_op(1, op(1, OpState.COMMIT, (3,), at=1))
    batch = take(state)
    assert kinds(batch) == [Reject, Promote]  # the next transaction is not held up
    reject = batch.actions[0]
    assert isinstance(reject, Reject)
    assert reject.reason == (
        "names 2 half record(s), but message 0 carries a message count of 3; promoting them "
        "would deliver part of the transaction: re-send its messages from their source"
    )
    assert state.counters.rejected == 1 and state.counters.promoted == 1
    assert batch.op_offset == 2 and state.pending_records == 0


def test_a_commit_naming_fewer_records_than_the_relay_read_of_its_transaction_is_rejected() -> None:
    """Messages sent one by one carry no count: a COMMIT naming the first of two (a checker that
    missed the second) is told only by the second record the relay read. A producer commits only
    once every send was acknowledged, so that record is one of the transaction's messages:
    promoting the one named would deliver part of it, silently."""
    state = PartitionState(0)
    state.add_half(half(0, 0, 0))
    state.add_half(half(1, 1))
    state.add_half(half(0, 3, 1))
    state.add_op(0, op(0, OpState.COMMIT, (0,), at=0))
    state.add_op(1, op(1, OpState.COMMIT, (1,), at=1))
    batch = take(state)
    assert kinds(batch) == [Reject, Promote]  # the next transaction is not held up
    reject = batch.actions[0]
    assert isinstance(reject, Reject)
    assert reject.reason == (
        "names 1 half record(s) (offsets 0), but the relay read message 1 of the transaction "
        "too (offset 3): a decision made from part of its records. Promoting the named ones "
        "would deliver part of the transaction: re-send its messages from their source"
    )
    assert state.counters.rejected == 1 and state.counters.promoted == 1
    assert batch.op_offset == 2 and state.pending_records == 0


def test_a_whole_commit_is_promoted_though_a_failed_attempt_left_a_copy_of_a_message() -> None:
    """A half send retried after an attempt whose records landed all the same (acknowledged
    without an offset, or late): the same message index twice, the COMMIT naming the retry's."""
    state = PartitionState(0)
    state.add_half(half(0, 0, 0))
    state.add_half(half(0, 1, 1))  # the failed attempt's copy
    state.add_half(half(0, 2, 1))  # the retry, acknowledged
    state.add_op(0, op(0, OpState.COMMIT, (0, 2), at=0))
    [promote] = take(state).actions
    assert isinstance(promote, Promote) and [r.index for r in promote.records] == [0, 1]


def test_a_commit_naming_part_of_an_evicted_transaction_is_rejected_once_read_back() -> None:
    state = PartitionState(0, max_held_records=1)
    state.add_half(half(0, 0, 0))
    state.add_half(half(0, 1, 1))
    state.add_half(half(1, 2))  # txn 0's values dropped under the cap; where they are is kept
    state.add_op(0, op(0, OpState.COMMIT, (0,), at=0))
    [reject] = take(state, fetch=lambda offsets: [half(0, 0, 0)]).actions
    assert isinstance(reject, Reject) and "read message 1 of the transaction too" in reject.reason


def test_a_parked_commit_naming_part_of_its_transaction_is_rejected_once_the_rest_is_read() -> None:
    """Parked while its topic was missing, before the reader reached the message it left out."""
    state = PartitionState(0)
    state.add_half(half(0, 0, 0))
    state.add_op(0, op(0, OpState.COMMIT, (0,), at=0))
    assert kinds(take(state, promotable=lambda o, r: "topic orders does not exist")) == [Remember]
    state.add_half(half(0, 1, 1))
    reject, forget = take(state).actions  # the topic is back
    assert isinstance(reject, Reject) and "read message 1 of the transaction" in reject.reason
    assert forget == Remember(TXN[0], None)
    assert state.counters.rejected == 1 and state.counters.promoted == 0


def test_a_commit_naming_more_records_than_their_message_count_is_rejected() -> None:
    state = PartitionState(0)
    state.add_half(half(0, 0, 0, count=1))
    state.add_half(half(0, 1, 1, count=1))
    state.add_op(0, op(0, OpState.COMMIT, (0, 1), at=0))
    [reject] = take(state).actions
    assert isinstance(reject, Reject)
    assert reject.reason.startswith(
        "names 2 half record(s), but message 0 carries a message count of 1;"
    )


def test_a_parked_commit_naming_part_of_its_transaction_is_rejected_when_retried() -> None:
    """Parked by a relay that did not check the message count, restored as parked here."""
    state = PartitionState(0)
    apply_history(state, [op(0, OpState.COMMIT, (0,), at=0)], [TXN[0]])
    state.add_half(half(0, 0, 0, count=2))
    state.add_half(half(0, 1, 1, count=2))
    reject, forget = take(state).actions
    assert isinstance(reject, Reject) and "carries a message count of 2" in reject.reason
    assert forget == Remember(TXN[0], None)
    assert not state.parked and state.counters.rejected == 1


def test_a_commit_naming_no_half_record_is_rejected_not_taken_as_done() -> None:
    state = PartitionState(0)
    state.add_half(half(0, 0))
    state.add_op(0, op(0, OpState.COMMIT, (), at=0))
    batch = take(state)
    [reject] = batch.actions
    assert isinstance(reject, Reject)
    assert reject.reason == "names no half record, so it would deliver nothing"
    assert batch.op_offset == 1


def test_undecodable_ops_advance_the_op_offset_in_order() -> None:
    state = PartitionState(0)
    state.add_op(0, None)
    state.add_op(1, op(0, OpState.COMMIT, (0,), at=1))
    state.add_op(2, None)
    batch = take(state)
    assert batch.actions == [] and (batch.half_offset, batch.op_offset) == (0, 1)


def test_a_long_pending_transaction_is_put_back_and_promoted_from_its_copy() -> None:
    state = PartitionState(0)
    state.add_half(half(0, 0, ts=1_000))
    state.add_half(half(1, 1, ts=1_000))
    state.add_op(0, op(1, OpState.COMMIT, (1,), at=0))
    state.op_frontier.reached_end()  # every op written so far was read
    # When txn 0 stays undecided past the put-back threshold
    batch = take(state, now=1_000 + HOUR_MS)
    assert kinds(batch) == [Promote, PutBack]
    put_back = batch.actions[1]
    assert isinstance(put_back, PutBack) and put_back.records[0].offset == 0
    # Then the committed half offset moves past it, and its op waits for the copy
    assert batch.half_offset == 2
    state.add_op(1, op(0, OpState.COMMIT, (0,), at=1))
    assert take(state, now=1_000 + HOUR_MS).actions == []
    state.add_half(half(0, 2, ts=1_000 + HOUR_MS, origin=0))  # the copy, read back
    [promote] = take(state, now=1_000 + HOUR_MS).actions
    assert isinstance(promote, Promote) and promote.records[0].offset == 2


def test_an_unmovable_transaction_is_never_put_back_and_the_ones_after_it_still_are() -> None:
    state = PartitionState(0)
    state.add_half(half(0, 0, ts=1_000))
    state.add_half(half(1, 1, ts=1_000))
    state.op_frontier.reached_end()
    # When txn 0's copy was refused and both stay undecided past the put-back threshold
    batch = state.take(1_000 + HOUR_MS, put_back_after_ms=HOUR_MS, unmovable={TXN[0]})
    # Then only txn 1 is put back, and the committed half offset waits at txn 0
    assert isinstance(batch, Batch) and kinds(batch) == [PutBack]
    assert batch.actions[0].records[0].txn_id == TXN[1]  # type: ignore[union-attr]
    assert batch.half_offset == 0
    # and txn 0's COMMIT promotes it from where it is
    state.add_op(0, op(0, OpState.COMMIT, (0,), at=0))
    [promote] = take(state, now=1_000 + HOUR_MS).actions
    assert isinstance(promote, Promote) and promote.records[0].offset == 0


def test_put_back_waits_until_the_ops_read_reach_past_the_threshold() -> None:
    """Catching up: the clock (the newest half read) is an hour on, the ops read so far are
    old. A transaction is put back only once it is undecided for the threshold as of the ops
    read (or the op partition was read to its end)."""
    state = PartitionState(0)
    state.add_half(half(0, 0, ts=1_000))
    state.add_half(half(1, 1, ts=1_000))
    now = 1_000 + 2 * HOUR_MS
    # When nothing is known of the op partition yet
    assert take(state, now=now).actions == []
    # When the ops read so far were written a minute after the halves
    state.add_op(0, op(1, OpState.COMMIT, (1,), at=0), 61_000)
    assert kinds(take(state, now=now)) == [Promote]  # txn 0 is not put back
    # When an op read was written past the threshold after txn 0's half
    state.add_op(1, None, 1_000 + HOUR_MS + 1)
    [put_back] = take(state, now=now).actions
    assert isinstance(put_back, PutBack) and put_back.records[0].txn_id == TXN[0]


def test_the_op_partition_read_to_its_end_measures_put_back_on_the_clock() -> None:
    state = PartitionState(0)
    state.add_half(half(0, 0, ts=1_000))
    state.add_op(0, op(9, OpState.ROLLBACK, (0,), at=0), 2_000)
    assert take(state, now=1_000 + HOUR_MS + 1).actions == []  # (txn 9: a repeat, counted)
    state.op_frontier.reached_end()
    assert kinds(take(state, now=1_000 + HOUR_MS + 1)) == [PutBack]
    # Given back after a rebalance, the ops written meanwhile are not read yet
    state.add_half(half(1, 2, ts=1_000))
    state.op_frontier.reassigned()
    assert take(state, now=1_000 + 2 * HOUR_MS).actions == []


def test_no_transaction_whose_op_waits_in_the_queue_is_put_back() -> None:
    """An op waiting at the head of the queue (its half record not read yet) holds back the
    ops read behind it: their transactions are undecided only because they are not handled."""
    state = PartitionState(0)
    state.add_half(half(1, 0, ts=1_000))
    state.add_op(0, op(0, OpState.COMMIT, (1,), at=0), 2_000)  # its half (offset 1) unread
    state.add_op(1, op(1, OpState.COMMIT, (0,), at=1), 1_000 + 2 * HOUR_MS)
    state.op_frontier.reached_end()
    assert take(state, now=1_000 + 3 * HOUR_MS).actions == []  # txn 1 waits, not put back
    state.add_half(half(0, 1, ts=1_000))
    assert [a.op.txn_id for a in take(state, now=1_000 + 3 * HOUR_MS).actions] == [  # type: ignore[union-attr]
        TXN[0],
        TXN[1],
    ]


def test_ops_read_behind_an_op_waiting_for_copies_hold_back_put_back_too() -> None:
    """An op waiting for its transaction's copies to be read back (put back just before it
    came) holds back the ops read behind it: their transactions are undecided only because
    those ops are not handled yet, so they are not put back."""
    state = PartitionState(0)
    state.add_half(half(0, 0, ts=1_000))
    state.op_frontier.reached_end()
    [put_back] = take(state, now=1_000 + HOUR_MS + 1).actions  # txn 0, its op late
    assert isinstance(put_back, PutBack)
    state.add_half(half(1, 1, ts=2_000))
    state.add_op(0, op(0, OpState.COMMIT, (0,), at=0), 1_000 + HOUR_MS + 2)  # waits: in flight
    state.add_op(1, op(1, OpState.COMMIT, (1,), at=1), 1_000 + HOUR_MS + 3)
    state.op_frontier.reached_end()
    assert take(state, now=2_000 + 2 * HOUR_MS).actions == []  # txn 1 is not put back
    state.add_half(half(0, 2, ts=1_000 + HOUR_MS + 1, origin=0))  # the copy, read back
    promoted = take(state, now=2_000 + 2 * HOUR_MS).actions
    assert [a.op.txn_id for a in promoted if isinstance(a, Promote)] == [TXN[0], TXN[1]]


def test_a_half_partition_read_to_its_end_counts_its_trailing_marker_as_passed() -> None:
    """Before: the reader stayed one short of the end (a commit marker is never delivered), so
    a repeat op after a restart - and every op behind it - waited for the next half record."""
    state = restore(Progress(half_offset=1, op_offset=0), [], partition=0, log_end=3)
    state.add_half(half(0, 1, origin=0))
    state.add_op(0, op(5, OpState.COMMIT, (0,), at=0))  # a repeat
    state.add_op(1, op(0, OpState.COMMIT, (0,), at=1))
    assert take(state).actions == []  # the reader has not passed the end it had at the restart
    state.half_read_to(3)  # the consumer's end-of-partition event, past the marker
    [promote] = take(state).actions
    assert isinstance(promote, Promote) and promote.op.txn_id == TXN[0]
    assert state.counters.repeats == 1


def test_values_over_the_memory_cap_are_dropped_and_fetched_when_committed() -> None:
    state = PartitionState(0, max_held_records=2)
    for i in range(4):
        state.add_half(half(i, i))
    assert state.held == 2 and state.pending_records == 4 and state.counters.evicted == 2
    state.add_op(0, op(0, OpState.COMMIT, (0,), at=0))  # txn 0's value was dropped
    batch = take(state, fetch=lambda offsets: [half(0, 0)])
    [promote] = batch.actions
    assert isinstance(promote, Promote) and promote.records[0].message.value == b"0/0"


def test_a_commit_for_a_missing_topic_is_parked_without_blocking_later_ones() -> None:
    state = PartitionState(0)
    state.add_half(half(0, 0))
    state.add_half(half(1, 1))
    state.add_op(0, op(0, OpState.COMMIT, (0,), at=0))
    state.add_op(1, op(1, OpState.COMMIT, (1,), at=1))

    def only_txn_1(o: OpRecord, records: tuple[HalfRecord, ...]) -> str | None:
        return None if o.txn_id == TXN[1] else "topic orders does not exist"

    batch = take(state, promotable=only_txn_1)
    parked = op(0, OpState.COMMIT, (0,), at=0)
    assert [a.op.txn_id for a in batch.actions if isinstance(a, Promote)] == [TXN[1]]
    assert batch.op_offset == 2 and batch.half_offset == 0  # its halves stay pending
    assert [a for a in batch.actions if isinstance(a, Remember)] == [Remember(TXN[0], parked)]
    progress = Progress.parse(batch.half_offset, batch.op_offset, batch.metadata)
    assert progress.rebuild_from == 0 and "parked" not in batch.metadata
    # After a restart it is parked again (from the state topic), not taken as decided
    rebuilt = restore(progress, [parked], partition=0, log_end=2, parked={TXN[0]: parked})
    rebuilt.add_half(half(0, 0))
    rebuilt.add_half(half(1, 1))
    assert TXN[0] in rebuilt.parked and TXN[0] not in rebuilt.decided
    promote, forget = take(rebuilt).actions
    assert isinstance(promote, Promote) and promote.op.txn_id == TXN[0]
    assert forget == Remember(TXN[0], None)


def test_parked_commits_go_before_later_ones_once_their_topic_takes_them() -> None:
    """Topic-wide conditions (a topic missing, or not writable by the relay) park every COMMIT
    to the topic, in op order. The batch in which the condition clears used to promote its new
    COMMITs first (new ops were handled before parked ones were retried): each landed before
    the earlier, parked transactions, on their keys too (``out_of_order``)."""
    state = PartitionState(0)
    for i in range(3):
        state.add_half(half(i, i))
        state.add_op(i, op(i, OpState.COMMIT, (i,), at=i))
    missing = take(state, promotable=lambda o, r: "topic orders does not exist")
    assert not [a for a in missing.actions if isinstance(a, Promote)]
    assert list(state.parked) == TXN[:3]
    state.add_half(half(3, 3))
    state.add_op(3, op(3, OpState.COMMIT, (3,), at=3))

    created = take(state, promotable=lambda o, r: None)

    promoted = [a.op.txn_id for a in created.actions if isinstance(a, Promote)]
    assert promoted == TXN[:4]
    assert not state.parked


def test_a_parked_commit_of_an_older_relay_is_parked_again_from_the_op_history() -> None:
    """Version 1 progress metadata named the parked ids; the ops come from the history."""
    legacy = Progress.parse(0, 2, f'{{"v":1,"l":0,"parked":["{TXN[0]}"]}}')
    assert legacy.legacy_parked == (TXN[0],)
    rebuilt = restore(legacy, [op(0, OpState.COMMIT, (0,), at=0)], partition=0, log_end=2)
    assert TXN[0] in rebuilt.parked and TXN[0] not in rebuilt.decided


def test_a_resumed_transaction_is_undecided_again_and_promoted_on_its_next_commit() -> None:
    state = PartitionState(0)
    state.add_half(half(0, 0))
    state.add_op(0, op(0, OpState.GIVEN_UP, (0,), at=0))
    assert kinds(take(state)) == [Drop]
    # The resume command re-appended the half (offset 1) and wrote RESUMED naming it
    state.add_half(half(0, 1, origin=0))  # read before the RESUMED op: still given up
    state.add_op(1, op(0, OpState.RESUMED, (1,), at=1))
    state.add_op(2, op(0, OpState.COMMIT, (0,), at=2))
    batch = take(state, fetch=lambda offsets: [half(0, 1, origin=0)])
    [promote] = batch.actions
    assert isinstance(promote, Promote) and promote.records[0].offset == 1
    assert state.counters.conflicts == 0


def test_progress_metadata_round_trips_and_foreign_metadata_means_no_history() -> None:
    for progress in (Progress(10, 20, 5), Progress(10, 20, 5, gap=(3, 8))):
        assert Progress.parse(10, 20, progress.metadata()) == progress
    assert Progress.parse(10, 20, "set by another tool") == Progress(10, 20, 20)
    assert Progress.parse(10, 20, None) == Progress(10, 20, 20)


def test_progress_metadata_has_a_constant_size_however_many_are_parked() -> None:
    """The broker refuses commit metadata over offset.metadata.max.bytes (4096 by default)."""
    state = PartitionState(0)
    for i in range(1000):
        state.add_half(half(i, i))
        state.add_op(i, op(i, OpState.COMMIT, (i,), at=i))
    batch = take(state, promotable=lambda o, r: "topic orders does not exist")
    assert len(state.parked) == 1000
    assert sum(isinstance(a, Remember) for a in batch.actions) == 1000
    assert len(batch.metadata) < 100


def test_parked_commits_over_the_memory_cap_are_not_read_back_while_they_wait() -> None:
    """Before: each batch read back the records of every parked transaction over the memory
    cap, only to hear again that its topic was missing: 90 broker round trips a batch here,
    1,000 with 1,000 parked (and each round trip started the scan of the parked ones over)."""
    state = PartitionState(0, max_held_records=10)
    for i in range(100):
        state.add_half(half(i, i))
        state.add_op(i, op(i, OpState.COMMIT, (i,), at=i))
    fetched: list[int] = []

    def fetch(offsets: tuple[int, ...]) -> list[HalfRecord]:
        fetched.extend(offsets)
        return [half(offsets[0], offsets[0])]

    exists = {"orders": False}

    def topic_of(o: OpRecord, topics: tuple[str, ...]) -> str | None:
        assert topics == ("orders",)
        return None if exists["orders"] else "topic orders does not exist"

    def waits(o: OpRecord, records: tuple[HalfRecord, ...]) -> str | None:
        return topic_of(o, tuple({r.message.topic for r in records}))

    asked = [0]

    def counted(o: OpRecord, records: tuple[HalfRecord, ...]) -> str | None:
        asked[0] += 1
        return waits(o, records)

    def batch() -> Batch:
        while True:
            result = state.take(
                0, put_back_after_ms=HOUR_MS, promotable=counted, still_parked=topic_of
            )
            if isinstance(result, Batch):
                return result
            state.supply(result.txn_id, fetch(result.offsets))

    assert batch().actions and len(state.parked) == 100
    # a question or two each (the 10 held are asked on the fast path, then the general one):
    # the parked ones are retried once a batch, not again at each of the 90 read-backs (with
    # that, the batch asked 4,115 questions)
    assert asked[0] <= 2 * 100
    assert len(fetched) == 90  # their values dropped under the cap: read back once to park
    for _ in range(5):
        assert batch().actions == []
    assert len(fetched) == 90  # and not again while the topic is missing
    # When the topic appears, each is read back once more and promoted
    exists["orders"] = True
    promoted = [a.op.txn_id for a in batch().actions if isinstance(a, Promote)]
    assert promoted == TXN[:100] and not state.parked
    assert len(fetched) == 180


def test_restored_parked_commits_over_the_memory_cap_are_each_asked_once_a_batch() -> None:
    """After a restart the state topic gives the parked COMMITs but not their topics: each is
    read back to be asked. Each read-back re-entered take, which scanned every parked one
    again: with 200 restored, 18,155 questions in the first batch."""
    n = 200
    parked = {TXN[i]: op(i, OpState.COMMIT, (i,), at=i) for i in range(n)}
    progress = Progress.parse(0, n, "")
    state = restore(
        progress, list(parked.values()), partition=0, log_end=n, parked=parked, max_held_records=10
    )
    for i in range(n):
        state.add_half(half(i, i))
    asked = [0]

    def missing(o: OpRecord, records: tuple[HalfRecord, ...]) -> str | None:
        asked[0] += 1
        return "topic orders does not exist"

    def fetch(offsets: tuple[int, ...]) -> list[HalfRecord]:
        return [half(offsets[0], offsets[0])]

    assert take(state, fetch=fetch, promotable=missing).actions == []
    assert len(state.parked) == n
    assert asked[0] == n


def test_a_commit_repeated_after_its_decision_is_forgotten_is_counted_never_promoted() -> None:
    state = PartitionState(0)
    state.add_half(half(0, 0))
    state.add_op(0, op(0, OpState.COMMIT, (0,), at=0))
    assert kinds(take(state)) == [Promote]
    assert not state.decided  # nothing remembered: the position tells
    for i in range(1, 200):
        state.add_half(half(i, i))
        state.add_op(i, op(i, OpState.COMMIT, (i,), at=i))
    take(state)
    state.add_op(200, op(0, OpState.COMMIT, (0,), at=200))  # a late repeat
    state.add_op(201, op(0, OpState.ROLLBACK, (0,), at=201))  # and a conflicting one
    batch = take(state)
    assert batch.actions == [] and batch.op_offset == 202
    assert state.counters.repeats == 2 and state.counters.promoted == 200


def test_after_a_restart_a_repeat_waits_for_copies_an_earlier_life_put_back() -> None:
    """Txn 0 was put back (its copy at offset 6) and the committed half offset moved past its
    original; after the restart its COMMIT, naming the original, must wait for the copy."""
    progress = Progress(half_offset=5, op_offset=0, rebuild_from=0)
    state = restore(progress, [], partition=0, log_end=8)
    state.add_op(0, op(0, OpState.COMMIT, (0,), at=0))
    state.add_op(1, op(1, OpState.COMMIT, (1,), at=1))  # decided long ago: a repeat
    state.add_half(half(2, 5))
    assert take(state).actions == []  # the reader is not past the end it had at the restart
    state.add_half(half(0, 6, origin=0))
    state.add_half(half(2, 7))
    batch = take(state)
    [promote] = batch.actions
    assert isinstance(promote, Promote) and promote.records[0].offset == 6
    assert state.counters.repeats == 1 and not state.decided


def test_a_commit_naming_records_lost_to_retention_unread_is_rejected() -> None:
    state = restore(Progress(5, 0, 0, gap=(0, 5)), [], partition=0, log_end=5)
    state.add_op(0, op(0, OpState.COMMIT, (2,), at=0))
    [reject] = take(state).actions
    assert isinstance(reject, Reject) and "removed by retention" in reject.reason
    assert Progress.parse(5, 1, take(state).metadata).gap == (0, 5)


def test_need_is_answered_before_anything_decided_earlier_is_lost() -> None:
    state = PartitionState(0, max_held_records=1)
    state.add_half(half(0, 0))
    state.add_half(half(1, 3))  # txn 0's value is dropped: over the memory cap
    state.add_op(0, op(1, OpState.COMMIT, (3,), at=0))
    state.add_op(1, op(0, OpState.COMMIT, (0,), at=1))  # halves not in memory
    first = state.take(0, put_back_after_ms=HOUR_MS)
    assert isinstance(first, Need) and first.offsets == (0,)
    state.supply(first.txn_id, [half(0, 0)])
    batch = take(state)
    assert [a.op.txn_id for a in batch.actions] == [TXN[1], TXN[0]]  # type: ignore[union-attr]

"""The relay's decision logic, without Kafka."""

from __future__ import annotations

from outbox.protocol import DecidedBy, HalfMessage, HalfRecord, OpRecord, OpState
from relay.state import Drop, Missing, PartitionState, Promote

TXN = ["01a203d8-301f-7701-b6f4-46800000000" + str(i) for i in range(10)]


def half(txn: int, offset: int, index: int = 0) -> HalfRecord:
    return HalfRecord(
        txn_id=TXN[txn],
        producer_group="g",
        message=HalfMessage(topic="orders", value=f"{txn}/{index}".encode(), key=b"k"),
        index=index,
        count=None,
        created_at_ms=0,
        check_count=0,
        partition=0,
        offset=offset,
    )


def op(txn: int, state: OpState, offsets: tuple[int, ...]) -> OpRecord:
    return OpRecord(
        txn_id=TXN[txn],
        state=state,
        producer_group="g",
        half_partition=0,
        half_offsets=offsets,
        decided_by=DecidedBy.PRODUCER,
        decided_at_ms=0,
    )


def test_commit_promotes_the_messages_in_index_order() -> None:
    state = PartitionState(0)
    state.add_half(half(0, 0, index=0))
    state.add_half(half(0, 1, index=1))
    state.add_op(0, op(0, OpState.COMMIT, (0, 1)))
    [action] = state.ready()
    assert isinstance(action, Promote)
    assert [r.index for r in action.records] == [0, 1]
    assert state.safe_offsets() == (2, 1)


def test_rollback_and_given_up_drop_the_messages() -> None:
    state = PartitionState(0)
    state.add_half(half(0, 0))
    state.add_half(half(1, 1))
    state.add_op(0, op(0, OpState.ROLLBACK, (0,)))
    state.add_op(1, op(1, OpState.GIVEN_UP, (1,)))
    actions = state.ready()
    assert [type(a) for a in actions] == [Drop, Drop]
    assert state.pending == 0 and state.counters.dropped == 2


def test_an_op_read_before_its_halves_waits_and_later_promotes() -> None:
    state = PartitionState(0)
    state.add_op(0, op(0, OpState.COMMIT, (0,)))
    assert state.ready() == []
    assert state.safe_offsets() == (0, 0)
    state.add_half(half(0, 0))
    assert [type(a) for a in state.ready()] == [Promote]


def test_commits_on_one_partition_are_promoted_in_op_order_not_half_order() -> None:
    state = PartitionState(0)
    # txn 1's half comes first on the half partition, but txn 0 committed first
    state.add_half(half(1, 0))
    state.add_op(0, op(0, OpState.COMMIT, (1,)))
    state.add_op(1, op(1, OpState.COMMIT, (0,)))
    assert state.ready() == []  # txn 0 waits for its half; txn 1 must not overtake it
    state.add_half(half(0, 1))
    assert [a.op.txn_id for a in state.ready()] == [TXN[0], TXN[1]]


def test_committed_half_offset_never_passes_an_undecided_half() -> None:
    state = PartitionState(0)
    state.add_half(half(0, 0))  # undecided
    for i in range(1, 5):
        state.add_half(half(i, i))
        state.add_op(i - 1, op(i, OpState.COMMIT, (i,)))
    assert len(state.ready()) == 4
    assert state.safe_offsets() == (0, 4)
    state.add_op(4, op(0, OpState.ROLLBACK, (0,)))
    state.ready()
    assert state.safe_offsets() == (5, 5)


def test_halves_of_transactions_decided_before_a_restart_are_not_pending() -> None:
    state = PartitionState(0, half_position=0, op_done=3)
    state.remember(TXN[0], OpState.COMMIT)
    state.add_half(half(0, 0))
    state.add_half(half(1, 1))
    assert state.pending == 1
    assert state.safe_offsets() == (1, 3)


def test_repeated_and_conflicting_ops_are_counted_and_ignored() -> None:
    state = PartitionState(0)
    state.add_half(half(0, 0))
    state.add_op(0, op(0, OpState.COMMIT, (0,)))
    state.add_op(1, op(0, OpState.COMMIT, (0,)))
    state.add_op(2, op(0, OpState.ROLLBACK, (0,)))
    actions = state.ready()
    assert [type(a) for a in actions] == [Promote]
    assert (state.counters.duplicates, state.counters.conflicts) == (1, 1)
    assert state.safe_offsets() == (1, 3)


def test_a_commit_whose_halves_were_read_past_is_reported_missing_instead_of_blocking() -> None:
    state = PartitionState(0)
    state.skip_half(0)  # e.g. an undecodable record at offset 0
    state.add_half(half(1, 1))
    state.add_op(0, op(0, OpState.COMMIT, (0,)))
    state.add_op(1, op(1, OpState.COMMIT, (1,)))
    actions = state.ready()
    assert [type(a) for a in actions] == [Missing, Promote]
    assert isinstance(actions[0], Missing) and actions[0].missing_offsets == (0,)


def test_undecodable_ops_advance_the_op_offset_in_order() -> None:
    state = PartitionState(0)
    state.add_op(0, None)
    state.add_op(1, op(0, OpState.COMMIT, (0,)))
    state.add_op(2, None)
    assert state.ready() == []
    assert state.safe_offsets() == (0, 1)

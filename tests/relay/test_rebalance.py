"""Which partitions a relay keeps across a rebalance, and which it rebuilds. Pure logic: the
decision needs no broker (the integration test is in test_partitions.py)."""

from __future__ import annotations

from relay.commit_token import stamped
from relay.partitions import Partitions
from relay.progress import Progress
from relay.state import PartitionState
from tests.relay.test_committed_progress import rebalance_on


def test_a_partition_is_kept_only_when_its_committed_progress_is_still_this_instances() -> None:
    metadata = Progress(10, 7, 7).metadata()
    ours = (10, 7, stamped(metadata, "ours.3"))
    states = {p: PartitionState(p) for p in range(6)}
    partitions = Partitions()
    partitions.committed = {
        0: ours,  # nothing committed since this instance let it go: kept
        1: (12, 9, stamped(Progress(12, 9, 9).metadata(), "theirs.1")),  # moved on: rebuilt
        3: ours,  # this instance never committed it: rebuilt
        # another member committed the same offsets (a parked transaction promoted while an
        # older one stays pending): only the token tells, and the partition is rebuilt
        4: (10, 7, stamped(metadata, "theirs.8")),
        # no token at all (an older relay's, in a group being upgraded): rebuilt
        5: (10, 7, metadata),
    }
    retained = {
        0: (states[0], ours),
        1: (states[1], ours),
        2: (states[2], ours),
        3: (states[3], None),
        4: (states[4], ours),
        5: (states[5], (10, 7, metadata)),
    }
    progress = {p: Progress() for p in (0, 1, 3, 4, 5)}  # 2 went to another member

    kept = rebalance_on(partitions).kept(retained, progress)

    assert kept == {0: states[0]}
    assert partitions.states == {0: states[0]}


def test_a_kept_partition_is_read_on_from_where_this_instance_stopped() -> None:
    state = PartitionState(0, half_position=40, op_position=15)
    assert state.op_read_position == 15
    state.add_op(15, None)
    state.add_op(16, None)  # read, not handled yet: the queue holds them
    assert state.op_read_position == 17
    assert state.half_position == 40

"""The fast path of a COMMIT (relay.held) against the general path: the same inputs hand out
the same batches - the same promotions, put-backs, dead letters and progress, in the same
order - with the fast path taken where it applies and declined everywhere else."""

from __future__ import annotations

import random
from typing import Any

import pytest

import relay.state
from outbox.protocol import OpState
from relay.actions import Batch
from relay.held import promote_held
from tests.relay.test_state import TXN, half, op, take
from tests.relay.test_state_properties import STATES_LIST, World, random_walk, run


class RecordingWorld(World):
    """A world that keeps every batch its relay handed out, and its counters."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.batches: list[tuple[Batch, dict[str, int]]] = []

    def _take(self) -> Batch:
        batch = super()._take()
        self.batches.append((batch, dict(vars(self.state.counters))))
        return batch


def walk(seed: int, cap: int) -> list[tuple[Batch, dict[str, int]]]:
    rng = random.Random(seed)
    steps = random_walk(rng)
    world = RecordingWorld(cap=cap)
    run(world, steps, [rng.choice(STATES_LIST)], repeat_ops=rng.random() < 0.5)
    return world.batches


@pytest.fixture
def fast_taken(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the COMMITs the fast path carried out."""
    taken: list[int] = []

    def counting(*args: Any) -> bool:
        done = promote_held(*args)
        taken.append(done)
        return done

    monkeypatch.setattr(relay.state, "promote_held", counting)
    return taken


def general_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay.state, "promote_held", lambda *args: False)


@pytest.mark.parametrize("cap", [1, 3, 1000], ids=["cap-1", "cap-3", "cap-1000"])
def test_seeded_random_walks_hand_out_the_same_batches_through_the_fast_and_the_general_path(
    cap: int, fast_taken: list[int]
) -> None:
    # Given the property test's interleavings (restarts, aborts, put-backs, evictions, repeats)
    fast = {seed: walk(seed, cap) for seed in range(600)}
    # Then the fast path carried out some COMMITs, and declined some it cannot
    assert sum(fast_taken) > 100 and fast_taken.count(False) > 100
    with pytest.MonkeyPatch.context() as patch:
        general_only(patch)
        for seed, batches in fast.items():
            assert walk(seed, cap) == batches, f"seed {seed}"


def test_a_commit_whose_topic_refuses_it_is_declined_and_parked_by_the_general_path(
    fast_taken: list[int],
) -> None:
    state = relay.state.PartitionState(0)
    state.add_half(half(0, 0))
    state.add_op(0, op(0, OpState.COMMIT, (0,), at=0))
    batch = take(state, promotable=lambda o, r: "topic orders does not exist")
    assert fast_taken == [False]
    assert TXN[0] in state.parked and [type(a).__name__ for a in batch.actions] == ["Remember"]


def test_a_commit_naming_a_record_the_reader_has_not_passed_is_declined_and_waits(
    fast_taken: list[int],
) -> None:
    state = relay.state.PartitionState(0)
    state.add_half(half(0, 0, index=0))
    state.add_op(0, op(0, OpState.COMMIT, (0, 1), at=0))  # its second record is not read yet
    assert take(state).actions == [] and fast_taken == [False]
    state.add_half(half(0, 1, index=1))
    [promote] = take(state).actions
    assert fast_taken == [False, True]
    assert [r.index for r in promote.records] == [0, 1]  # type: ignore[union-attr]


def test_a_commit_naming_part_of_the_records_held_is_declined_and_rejected(
    fast_taken: list[int],
) -> None:
    state = relay.state.PartitionState(0)
    state.add_half(half(0, 0, index=0))
    state.add_half(half(0, 1, index=1))
    state.add_op(0, op(0, OpState.COMMIT, (0,), at=0))  # names the first of the two held
    [reject] = take(state).actions
    assert fast_taken == [False] and type(reject).__name__ == "Reject"
    assert "read message 1 of the transaction too (offset 1)" in reject.reason  # type: ignore[attr-defined]


def test_a_commit_naming_an_offset_not_read_yet_waits_though_its_indexes_are_held(
    fast_taken: list[int],
) -> None:
    # Given a held record of index 0 at offset 0, and a COMMIT naming offset 1 (the reader is
    # at 1): which record it means is not known until offset 1 is read
    state = relay.state.PartitionState(0)
    state.add_half(half(0, 0))
    state.add_op(0, op(0, OpState.COMMIT, (1,), at=0))
    assert take(state).actions == [] and fast_taken == [False]
    assert state.waiting_op() is not None

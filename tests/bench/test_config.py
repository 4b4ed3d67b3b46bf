"""The benchmark's settings refuse what could not run (bench/config.py)."""

from __future__ import annotations

import pytest

from bench.config import BenchConfig


@pytest.mark.parametrize("processes", [0, 49])
def test_generator_processes_outside_one_to_the_worker_count_are_refused(processes: int) -> None:
    with pytest.raises(ValueError, match=rf"e2e_processes={processes} must be 1 to e2e_workers"):
        BenchConfig(e2e_processes=processes)


def test_every_process_may_have_a_single_worker() -> None:
    assert BenchConfig(e2e_processes=48, e2e_workers=48).e2e_processes == 48


def test_a_producer_path_left_with_the_floor_at_ten_messages_only_is_refused() -> None:
    """The floor runs one message per transaction: asked alone at 10 the table was empty."""
    with pytest.raises(ValueError, match=r"add 1 to messages"):
        BenchConfig(impls=("protocol_floor",), messages=(10,))
    # with another impl, or at 1 message, or without the producer path, there is work to do
    assert BenchConfig(impls=("ours", "protocol_floor"), messages=(10,)).messages == (10,)
    assert BenchConfig(impls=("protocol_floor",), messages=(1, 10)).messages == (1, 10)
    assert BenchConfig(
        impls=("protocol_floor",), messages=(10,), scenarios=("producer_async",)
    ).scenarios == ("producer_async",)

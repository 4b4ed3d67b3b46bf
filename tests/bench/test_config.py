"""The benchmark's settings refuse a generator that could not run (bench/config.py)."""

from __future__ import annotations

import pytest

from bench.config import BenchConfig


@pytest.mark.parametrize("processes", [0, 49])
def test_generator_processes_outside_one_to_the_worker_count_are_refused(processes: int) -> None:
    with pytest.raises(ValueError, match=rf"e2e_processes={processes} must be 1 to e2e_workers"):
        BenchConfig(e2e_processes=processes)


def test_every_process_may_have_a_single_worker() -> None:
    assert BenchConfig(e2e_processes=48, e2e_workers=48).e2e_processes == 48

"""What a watcher saw, read back: the first sighting of a record decides."""

from __future__ import annotations

from bench.watch import Arrivals


def test_a_records_first_timestamp_is_kept_when_it_is_seen_again() -> None:
    seen = Arrivals(["1", "2", "1"], ["r", "r", "r"], [10, 20, 30], [1_000, 1_005, 1_009])
    assert seen.first_timestamp() == {"1": 1_000, "2": 1_005}
    assert seen.first_arrival() == {"1": 10, "2": 20}

"""Each topic is read from a little before the range to its end; the range itself is a flag."""

from __future__ import annotations

import json

from checker.audit.bounds import AtOffsets, AtTime, Earliest, Latest
from checker.audit.plan import NEVER, InRange, plan_read


def test_earliest_to_latest_reads_everything_and_everything_is_in_range() -> None:
    read = plan_read("h", 3, Earliest(), Latest(), lookback_ms=1000)
    assert read.options == {"startingOffsets": "earliest", "endingOffsets": "latest"}
    assert read.in_range == InRange()


def test_a_time_range_is_read_from_the_lookback_and_judged_from_its_start() -> None:
    read = plan_read("h", 3, AtTime(10_000), AtTime(20_000), lookback_ms=4_000)
    assert read.options["startingTimestamp"] == "6000"
    assert read.options["startingOffsetsByTimestampStrategy"] == "latest"
    assert read.options["endingOffsets"] == "latest"
    assert read.in_range == InRange(start_ms=10_000, end_ms=20_000)


def test_the_lookback_never_reaches_before_the_epoch() -> None:
    read = plan_read("h", 1, AtTime(1_000), Latest(), lookback_ms=60_000)
    assert read.options["startingTimestamp"] == "0"


def test_offsets_name_every_partition_for_spark_and_only_the_named_ones_are_limited() -> None:
    start = AtOffsets({"h": {0: 5, 2: -1}})
    end = AtOffsets({"h": {0: 9, 1: -2}})
    read = plan_read("h", 3, start, end, lookback_ms=0)
    assert json.loads(read.options["startingOffsets"]) == {"h": {"0": 5, "1": -2, "2": -1}}
    assert read.in_range.start_offsets == {0: 5, 2: NEVER}
    assert read.in_range.end_offsets == {0: 9, 1: 0}


def test_a_topic_the_offsets_do_not_name_is_read_whole() -> None:
    read = plan_read("op", 3, AtOffsets({"h": {0: 5}}), Latest(), lookback_ms=0)
    assert read.options["startingOffsets"] == "earliest"
    assert read.in_range == InRange()

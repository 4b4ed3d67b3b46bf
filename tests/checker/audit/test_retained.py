"""Where each topic holds every record again after retention removed some of it."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from checker.audit.plan import TopicRead
from checker.audit.retained import HEAD_RECORDS, complete_since, read_from, read_from_start

pytestmark = pytest.mark.integration  # starts Spark (a JVM), no Kafka


def test_partitions_that_lost_records_are_complete_from_their_first_record_left(
    spark: Any,
) -> None:
    asked: list[TopicRead] = []

    def read(what: TopicRead) -> Any:
        asked.append(what)
        at = [dt.datetime.fromtimestamp(s, dt.UTC) for s in (2.0, 1.5, 1.0)]
        # partition 1's second record is stamped earlier (CreateTime need not rise): its
        # first record's time counts, not the least
        rows = [("h", 1, 5, at[0]), ("h", 1, 6, at[1]), ("h", 3, 9, at[2])]
        schema = "topic string, partition int, offset long, timestamp timestamp"
        return spark.createDataFrame(rows, schema)

    held = {
        # never lost a record / lost some / lost some, shows none at its head / lost some
        "h": {0: (0, 10), 1: (5, 100), 2: (7, 9), 3: (9, 12)},
        "o": {0: (0, 3)},  # never lost a record: not read, no bound
    }
    as_of, kept = 1_000_000, 900_000
    found = complete_since(read, held, retention_ms={"h": kept}, now_ms=as_of)
    # partition 2 shows nothing: complete from as_of - retention.ms, the latest of the three
    assert found == {"h": as_of - kept}
    [what] = asked
    assert what.topic == "h"
    assert json.loads(what.options["startingOffsets"]) == {"h": {"0": 10, "1": 5, "2": 7, "3": 9}}
    ends = {"0": 10, "1": 5 + HEAD_RECORDS, "2": 9, "3": 12}
    assert json.loads(what.options["endingOffsets"]) == {"h": ends}

    # with a longer retention, the first records left decide: the later of partitions 1 and 3
    assert complete_since(read, held, retention_ms={"h": as_of}, now_ms=as_of) == {"h": 2_000}
    # unlimited retention and a partition that shows nothing: nothing before the audit's clock
    assert complete_since(read, held, retention_ms={}, now_ms=as_of) == {"h": as_of}
    # every record gone: nothing is read
    asked.clear()
    emptied = {"h": {0: (4, 4)}}
    assert complete_since(read, emptied, retention_ms={"h": kept}, now_ms=as_of) == {
        "h": as_of - kept
    }
    assert asked == []
    assert complete_since(read, {"o": {0: (0, 3)}}, retention_ms={}, now_ms=as_of) == {}


def test_an_op_names_removed_half_records_only_where_the_half_topic_was_read_from_its_start() -> (
    None
):
    held = {0: (5, 20), 1: (5, 20), 2: (9, 9), 3: (0, 4)}
    # partition 0 read from its start; 1 from later (a time --from): a put-back copy may lie
    # before what was read, its op naming removed originals; 2 holds nothing; 3 nothing read
    first_read = {0: 5, 1: 12}
    assert read_from_start(held, first_read, earliest=False) == {0: 5, 2: 9}
    # read from earliest: every partition, even one whose first record read lies past its
    # start (a transaction marker or an aborted put-back copy at its head)
    assert read_from_start(held, {0: 6, 1: 12}, earliest=True) == {0: 5, 1: 5, 2: 9, 3: 0}
    assert read_from_start(held, {0: 6, 1: 12}, earliest=False) == {2: 9}


def test_an_op_names_half_records_before_the_range_below_the_first_offset_read() -> None:
    held = {0: (5, 20), 1: (5, 20), 2: (9, 9), 3: (0, 4)}
    # partition 1 read from offset 12 on (a time --from less the lookback, or an offsets
    # --from): an op naming offsets below 12 names a transaction begun before the range;
    # partition 3, of which nothing was read: where the read began is not known
    assert read_from(held, {0: 5, 1: 12}, earliest=False) == {0: 5, 1: 12}
    # read from earliest: from each log start, whatever the first record read
    assert read_from(held, {0: 6, 1: 12}, earliest=True) == {0: 5, 1: 5, 2: 9, 3: 0}

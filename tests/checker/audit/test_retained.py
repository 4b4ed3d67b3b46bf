"""Where each topic holds every record, and where the range starts because of it."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from checker.audit.bounds import AtOffsets, AtTime, Earliest
from checker.audit.plan import TopicRead
from checker.audit.retained import HEAD_RECORDS, complete_since, judged_from


def test_the_range_starts_where_the_half_and_op_topics_are_complete() -> None:
    assert judged_from(Earliest(), None) == Earliest()
    assert judged_from(Earliest(), 5_000) == AtTime(5_000)
    assert judged_from(AtTime(4_000), 5_000) == AtTime(5_000)
    assert judged_from(AtTime(6_000), 5_000) == AtTime(6_000)
    named = AtOffsets({"h": {0: 3}})
    assert judged_from(named, 5_000) is named  # offsets the operator named are kept


@pytest.mark.integration  # starts Spark (a JVM), no Kafka
def test_only_the_heads_of_partitions_that_lost_records_are_read(spark: Any) -> None:
    asked: list[TopicRead] = []

    def read(what: TopicRead) -> Any:
        asked.append(what)
        at = [dt.datetime.fromtimestamp(s, dt.UTC) for s in (2.0, 2.5, 1.0)]
        rows = [("h", 1, at[0]), ("h", 1, at[1]), ("h", 3, at[2])]
        return spark.createDataFrame(rows, "topic string, partition int, timestamp timestamp")

    held = {
        # never lost a record / lost some / lost every one / lost some
        "h": {0: (0, 10), 1: (5, 100), 2: (7, 7), 3: (9, 12)},
        "o": {0: (0, 3)},  # never lost a record: not read
    }
    assert complete_since(read, held) == {"h": 2_000}  # the later of partitions 1 and 3
    [what] = asked
    assert what.topic == "h"
    assert json.loads(what.options["startingOffsets"]) == {"h": {"0": 10, "1": 5, "2": 7, "3": 9}}
    ends = {"0": 10, "1": 5 + HEAD_RECORDS, "2": 7, "3": 12}
    assert json.loads(what.options["endingOffsets"]) == {"h": ends}
    assert complete_since(read, {"o": {0: (0, 3)}}) == {}

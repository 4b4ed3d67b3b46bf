"""Which part of each topic the audit reads, and which of those records are in its range.

Every topic is read from a little before the range (so that transactions begun earlier are
recognised) to its current end (decisions, put-back copies and promotions come after the half
records they belong to). Whether a record is *in range* is a separate question, answered by
:class:`InRange`: only transactions whose first half record is in range are judged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from checker.audit.bounds import AtOffsets, AtTime, Bound

#: Spark's offsets JSON: -2 is a partition's earliest offset, -1 its latest.
EARLIEST_OFFSET = -2
LATEST_OFFSET = -1
#: An offset no partition reaches: "nothing of this partition is in range".
NEVER = 2**62


@dataclass(frozen=True)
class InRange:
    """The records of one topic that are inside the audited range.

    Times are broker timestamps (Unix ms), offsets are per partition; ``None`` means unbounded.
    """

    start_ms: int | None = None
    end_ms: int | None = None
    start_offsets: Mapping[int, int] | None = None
    end_offsets: Mapping[int, int] | None = None


@dataclass(frozen=True)
class TopicRead:
    """One topic: the Spark Kafka source options for what to read, and what is in range."""

    topic: str
    options: Mapping[str, str] = field(default_factory=dict)
    in_range: InRange = field(default_factory=InRange)


def plan_read(
    topic: str, partitions: int, start: Bound, end: Bound, *, lookback_ms: int
) -> TopicRead:
    """How to read ``topic`` (with ``partitions`` partitions) for the range [start, end)."""
    options = {"endingOffsets": "latest"}
    in_range = InRange()
    if isinstance(start, AtTime):
        options["startingTimestamp"] = str(max(0, start.ms - lookback_ms))
        # A partition with nothing after that time starts at its end instead of failing.
        options["startingOffsetsByTimestampStrategy"] = "latest"
        in_range = InRange(start_ms=start.ms)
    elif isinstance(start, AtOffsets) and topic in start.offsets:
        named = start.offsets[topic]
        every = {p: named.get(p, EARLIEST_OFFSET) for p in range(partitions)}
        options["startingOffsets"] = json.dumps({topic: {str(p): o for p, o in every.items()}})
        in_range = InRange(start_offsets={p: _concrete(o) for p, o in named.items()})
    else:
        options["startingOffsets"] = "earliest"
    if isinstance(end, AtTime):
        in_range = InRange(start_ms=in_range.start_ms, end_ms=end.ms, **_offsets(in_range))
    elif isinstance(end, AtOffsets) and topic in end.offsets:
        ends = {p: _concrete(o) for p, o in end.offsets[topic].items()}
        in_range = InRange(
            start_ms=in_range.start_ms, start_offsets=in_range.start_offsets, end_offsets=ends
        )
    return TopicRead(topic, options, in_range)


def _offsets(in_range: InRange) -> dict[str, Mapping[int, int] | None]:
    return {"start_offsets": in_range.start_offsets, "end_offsets": in_range.end_offsets}


def _concrete(offset: int) -> int:
    """-2 (earliest) as 0, -1 (latest) as an offset past every record."""
    if offset == EARLIEST_OFFSET:
        return 0
    if offset == LATEST_OFFSET:
        return NEVER
    return offset

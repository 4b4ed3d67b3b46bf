"""Where a checker starts reading a partition it is given, and what it remembers of it.

The committed progress of a partition pair (the checker group's offsets, written with each
round's Kafka transaction) says:

- the half offset: never past the first record of a transaction pending at commit time, so
  reading on from there finds every pending transaction again;
- the *floor*, in the op offset's metadata (``{"v": 1, "floor_ms": ...}``): the broker time of
  the oldest pending transaction's first record (or of the last half record read). An op is
  appended after its transaction's halves, so every decision of a transaction whose halves lie
  at or after the committed half offset has a broker time at or after the floor: the op
  partition is read from the floor's offset (less ``slack_ms`` for the clocks of two brokers),
  not from its beginning.

Check counts come back from the state topic (:mod:`outbox.protocol.state`). So a restart costs
what is pending, not the topics' history.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from outbox.protocol.state import CheckCount, StateOwner
from outbox.protocol.topics import TopicNames
from outbox.state_log import no_progress, read_state
from outbox.watermarks import Watermarks

log = logging.getLogger("checker")

PROGRESS_VERSION = 1


def progress_metadata(floor_ms: int | None) -> str:
    return json.dumps({"v": PROGRESS_VERSION, "floor_ms": floor_ms}, separators=(",", ":"))


def floor_of(metadata: str | None) -> int | None:
    """The floor stored with a committed op offset; None when there is none (or not ours)."""
    try:
        document = json.loads(metadata or "")
    except ValueError:
        return None
    if not isinstance(document, dict) or document.get("v") != PROGRESS_VERSION:
        return None
    floor = document.get("floor_ms")
    return floor if isinstance(floor, int) else None


@dataclass(frozen=True)
class Start:
    """Where to read one partition pair from."""

    half_offset: int
    op_offset: int


def starts(
    consumer: Consumer,
    names: TopicNames,
    partitions: Iterable[int],
    *,
    slack_ms: int,
    progress: Callable[[], None] | None = None,
) -> dict[int, Start]:
    """Start offsets of ``partitions`` from the committed progress (the beginning where there
    is none: a first start reads all). ``progress`` is called after each call to the broker
    (each may wait up to 30 s): the checker's watchdog counts them as its loop turning.

    Raises:
        KafkaException: the committed offsets, or the op offsets for the floors, could not be
            read (the session starts over; reading from the beginning instead would be silent).
    """
    numbers = sorted(set(partitions))
    wanted = [TopicPartition(t, p) for p in numbers for t in (names.half, names.op)]
    turned = progress or no_progress
    committed = {(tp.topic, tp.partition): tp for tp in consumer.committed(wanted, 30)}
    turned()
    for tp in committed.values():
        if tp.error is not None:
            raise KafkaException(tp.error)
    floors = {}
    for p in numbers:
        floor = floor_of(committed[(names.op, p)].metadata)
        if floor is not None and committed[(names.half, p)].offset >= 0:
            floors[p] = floor
    op_starts = _offsets_for_times(consumer, names.op, floors, slack_ms, turned)
    result = {}
    for p in numbers:
        half = committed[(names.half, p)].offset
        result[p] = Start(
            half if half >= 0 else OFFSET_BEGINNING, op_starts.get(p, OFFSET_BEGINNING)
        )
    return result


def half_start(watermarks: Watermarks, topic: str, partition: int, committed: int) -> int:
    """Where to read a half partition from: its committed offset while the log holds it,
    else its beginning (the session's consumer never resets an offset by itself).

    Below the log start, retention removed records the group had not read (or, on purpose,
    the originals of a transaction taken up from its copies): those transactions are known by
    their put-back copies only, which the tracker takes up
    (:meth:`checker.tracker.Tracker.reading_from`).
    Past the end, the log was cut back (an unclean leader election) or the topic made again:
    all of it is read, as a new group would.

    Raises:
        KafkaException: the partition's watermarks could not be read.
    """
    if committed < 0:
        return OFFSET_BEGINNING
    low, high = watermarks.query(topic, partition, timeout=10)
    if low <= committed <= high:
        return committed
    if committed > high:
        log.warning(
            "%s[%d]: committed offset %d is past the partition's end %d (its log was cut "
            "back, or the topic made again); reading it from its beginning",
            topic,
            partition,
            committed,
            high,
        )
    else:
        log.warning(
            "%s[%d]: offsets %d..%d are no longer in the log (retention removed them); "
            "reading on from %d. Undecided transactions whose records were among them are "
            "taken up from their put-back copies",
            topic,
            partition,
            committed,
            low - 1,
            low,
        )
    return OFFSET_BEGINNING


def _offsets_for_times(
    consumer: Consumer,
    topic: str,
    floors: dict[int, int],
    slack_ms: int,
    turned: Callable[[], None],
) -> dict[int, int]:
    if not floors:
        return {}
    asked = [TopicPartition(topic, p, max(0, ms - slack_ms)) for p, ms in floors.items()]
    found = {}
    answered = consumer.offsets_for_times(asked, 30)
    turned()
    for tp in answered:
        if tp.error is not None:
            raise KafkaException(tp.error)
        if tp.offset < 0:  # nothing that recent: the end
            tp.offset = int(consumer.get_watermark_offsets(tp, timeout=10)[1])
            turned()
        found[tp.partition] = int(tp.offset)
    return found


def restore_counts(
    config: dict[str, Any],
    names: TopicNames,
    group_id: str,
    partitions: Iterable[int],
    *,
    watermarks: Watermarks,
    progress: Callable[[], None] | None = None,
) -> dict[str, tuple[int, CheckCount]]:
    """The check counts this checker group keeps on the state topic for ``partitions``:
    txn id -> (partition, count). ``watermarks`` tells where the state partitions end;
    ``progress`` is called after each step of the read (:func:`outbox.state_log.read_state`).

    Raises:
        KafkaOperationError: a partition could not be read to its end.
    """
    found = read_state(
        config,
        names,
        StateOwner.CHECKER,
        group_id,
        partitions,
        watermarks=watermarks,
        progress=progress,
    )
    return {
        txn: (partition, value)
        for txn, (partition, value) in found.items()
        if isinstance(value, CheckCount)
    }

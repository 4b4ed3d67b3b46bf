"""Rebuilding a partition's state from its committed progress and the op topic.

The committed progress (half offset, op offset, and the metadata stored with the op offset) says
where to resume reading and from which op offset (``rebuild_from``) decisions must be re-learnt,
so that re-read half records of transactions decided before the committed op offset are not
taken as pending. Decisions from a trailing time window are re-learnt too, so that a late
duplicate op (a producer's op arriving after the checker already decided) is still recognised.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from outbox.errors import KafkaOperationError, ProtocolError
from outbox.protocol.op import OpRecord, decode_op
from outbox.protocol.states import TERMINAL_STATES, OpState
from relay.state import PartitionState, Progress

log = logging.getLogger("relay")


def apply_history(state: PartitionState, ops: Iterable[OpRecord], parked: Iterable[str]) -> None:
    """Re-learn decisions from ops that were handled before the committed op offset.

    ``parked`` names COMMITs that were handled but not yet written: they are parked again,
    not remembered as decided.
    """
    parked_ids = set(parked)
    for op in ops:
        if op.state is OpState.RESUMED:
            state.decided.pop(op.txn_id, None)
            state.parked.pop(op.txn_id, None)
            continue
        if op.state not in TERMINAL_STATES or op.txn_id in state.decided:
            continue
        if op.txn_id in state.parked:
            continue
        if op.txn_id in parked_ids and op.state is OpState.COMMIT:
            state.parked[op.txn_id] = op
        else:
            state._remember(op.txn_id, op.state)


def restore(
    progress: Progress,
    history: Iterable[OpRecord],
    *,
    partition: int,
    log_end: int,
    max_held_records: int = 10_000,
    decided_memory: int = 200_000,
) -> PartitionState:
    """The state of a partition pair committed as ``progress``, given the ops before its op
    offset (at least those from ``progress.rebuild_from``) and the half partition's end now.

    Until the reader passes ``log_end``, the re-learnt decisions stay needed by any further
    rebuild, so the committed rebuild point is carried over.
    """
    state = PartitionState(
        partition,
        half_position=progress.half_offset,
        op_position=progress.op_offset,
        max_held_records=max_held_records,
        decided_memory=decided_memory,
    )
    apply_history(state, history, progress.parked)
    if progress.half_offset < log_end:
        state.ahead.append((progress.rebuild_from, log_end))
    return state


class OpHistory:
    """Reads a range of an op partition (a consumer of its own, assigned, never committing)."""

    def __init__(self, config: dict[str, Any], topic: str) -> None:
        self.topic = topic
        self._consumer = Consumer(
            {
                **config,
                "group.id": "outbox-relay-rebuild",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                # never jump silently: a read that skipped ops would forget decisions
                "auto.offset.reset": "error",
            }
        )

    def starts_for_time(self, partitions: Iterable[int], ms: int) -> dict[int, int]:
        """The first offset of each partition with a timestamp at or after ``ms``, in one
        request (asking partition by partition costs a round trip each on a rebalance)."""
        wanted = [TopicPartition(self.topic, p, ms) for p in partitions]
        if not wanted:
            return {}
        starts = {}
        for tp in self._consumer.offsets_for_times(wanted, 10):
            if tp.offset < 0:  # nothing that recent: the end
                tp.offset = int(self._consumer.get_watermark_offsets(tp, timeout=10)[1])
            starts[tp.partition] = int(tp.offset)
        return starts

    def read(self, partition: int, start: int, end: int) -> list[OpRecord]:
        """Decodable ops with offsets in [start, end); undecodable ones were dead-lettered."""
        ops: list[OpRecord] = []
        if start >= end:
            return ops
        tp = TopicPartition(self.topic, partition, start)
        self._consumer.assign([tp])
        idle = 0
        while True:
            msg = self._consumer.poll(1.0)
            if msg is None:
                idle += 1
                position = self._consumer.position([TopicPartition(self.topic, partition)])[0]
                if position.offset >= end:
                    break  # transaction markers and compaction leave gaps below the end
                if idle > 30:
                    raise KafkaOperationError(
                        f"op partition {partition} could not be read from {start} to {end}"
                    )
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._AUTO_OFFSET_RESET:
                    low, _ = self._consumer.get_watermark_offsets(tp, timeout=10, cached=False)
                    if start < low:  # the oldest ops are gone (a delete policy): from the start
                        start = tp.offset = int(low)
                        self._consumer.assign([tp])
                        continue
                    raise KafkaOperationError(
                        f"op partition {partition}: offset {start} out of range for now "
                        f"({error.str()}); read again later",
                        error,
                    )
                if error.code() == KafkaError._PARTITION_EOF:
                    if int(msg.offset() or 0) >= end:
                        break
                    # The end as the broker sees it now lies below offsets read before: its
                    # high watermark right after a restart can (it is restored from a
                    # checkpoint). Stopping here would forget decisions - and a repeated op
                    # read later would promote a transaction again. Wait for it.
                    idle += 1
                    if idle > 30:
                        raise KafkaOperationError(
                            f"op partition {partition} ends at {msg.offset()} for now, below "
                            f"{end}; read again later"
                        )
                    time.sleep(0.2)
                    continue
                raise KafkaOperationError(f"reading op partition {partition}: {error}", error)
            offset = int(msg.offset() or 0)
            if offset >= end:
                break
            try:
                op = decode_op(msg.key(), msg.value(), partition=partition, offset=offset)
            except ProtocolError:
                op = None
            if op is not None:
                ops.append(op)
            if offset >= end - 1:
                break
        self._consumer.unassign()
        return ops

    def close(self) -> None:
        self._consumer.close()


def rebuild(
    history: OpHistory,
    partition: int,
    progress: Progress,
    *,
    log_end: int,
    window_start: int,
    max_held_records: int,
    decided_memory: int,
) -> PartitionState:
    """The state of a partition pair whose progress was committed as ``progress``;
    ``log_end`` is the half partition's end, just read from the broker; ``window_start`` the
    first op offset of the trailing dedup window."""
    start = min(progress.rebuild_from, window_start)
    ops = history.read(partition, max(start, 0), progress.op_offset)
    state = restore(
        progress,
        ops,
        partition=partition,
        log_end=log_end,
        max_held_records=max_held_records,
        decided_memory=decided_memory,
    )
    log.info(
        "partition %d rebuilt: half from %d, op from %d (decisions re-learnt from op %d: %d); "
        "%d parked",
        partition,
        progress.half_offset,
        progress.op_offset,
        start,
        len(ops),
        len(state.parked),
    )
    return state

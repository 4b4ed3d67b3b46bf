"""Rebuilding a partition's state from its committed progress, the op topic and the state topic.

The committed progress (half offset, op offset, and the metadata stored with the op offset) says
where to resume reading and from which op offset (``rebuild_from``) decisions must be re-learnt,
so that re-read half records of transactions decided before the committed op offset are not
taken as pending: exactly the ops in [``rebuild_from``, op offset), however many (no memory
cap: the rebuild point trails the oldest pending record, which put-back keeps recent). They are
held only until the reader has passed the end the half partition has now
(:mod:`relay.decisions`). Parked COMMITs come back from the state topic.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from outbox import kafka_clients
from outbox.errors import KafkaOperationError, ProtocolError
from outbox.logs import fields
from outbox.protocol.op import OpRecord, decode_op
from outbox.protocol.state import Parked, StateOwner
from outbox.protocol.states import TERMINAL_STATES, OpState
from outbox.state_log import read_state
from outbox.watermarks import Watermarks
from relay.progress import Progress
from relay.settings import RelaySettings
from relay.state import PartitionState

log = logging.getLogger("relay")


def apply_history(
    state: PartitionState,
    ops: Iterable[OpRecord],
    legacy_parked: Iterable[str] = (),
) -> None:
    """Re-learn decisions from ops that were handled before the committed op offset.

    They are remembered until the reader passes ``state.resumed_end``, the end the half
    partition had at the rebuild. Transactions parked in ``state`` (from the state topic) are
    not decided. ``legacy_parked``
    names COMMITs an older relay parked in its progress metadata: they are parked again from
    their ops.
    """
    legacy = set(legacy_parked)
    for op in ops:
        if op.state is OpState.RESUMED:
            state.decided.pop(op.txn_id, None)
            if op.txn_id in legacy:
                state.parked.pop(op.txn_id, None)
            continue
        if op.state not in TERMINAL_STATES or op.txn_id in state.decided:
            continue
        if op.txn_id in state.parked:
            continue
        if op.txn_id in legacy and op.state is OpState.COMMIT:
            state.parked[op.txn_id] = op
        elif state.resumed_end:  # (else no half record is read again: nothing to tell apart)
            state.decided.remember(op.txn_id, op.state, until=state.resumed_end)


def restore(
    progress: Progress,
    history: Iterable[OpRecord],
    *,
    partition: int,
    log_end: int,
    parked: Mapping[str, OpRecord] | None = None,
    max_held_records: int = 10_000,
) -> PartitionState:
    """The state of a partition pair committed as ``progress``, given the ops in
    [``progress.rebuild_from``, op offset), the half partition's end now, and the COMMITs the
    state topic says are parked.

    Until the reader passes ``log_end``, the re-learnt decisions stay needed by any further
    rebuild, so the committed rebuild point is carried over.
    """
    state = PartitionState(
        partition,
        half_position=progress.half_offset,
        op_position=progress.op_offset,
        max_held_records=max_held_records,
        gap=progress.gap,
    )
    state.parked.update(parked or {})
    if progress.half_offset < log_end:
        state.resumed_end = log_end
        state.rebuild_point.open(progress.rebuild_from, log_end)
    apply_history(state, history, progress.legacy_parked)
    return state


class OpHistory:
    """Reads a range of an op partition (a consumer of its own, assigned, never committing)."""

    def __init__(self, config: dict[str, Any], topic: str) -> None:
        self.topic = topic
        self._consumer = kafka_clients.consumer(
            {
                **config,
                "group.id": "outbox-relay-rebuild",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                # never jump silently: a read that skipped ops would forget decisions
                "auto.offset.reset": "error",
                # Reads history that exists: no long poll. With the default 500 ms, the fetch
                # left waiting at the end of the partition read before held up the first
                # fetch of the next one, half a second per partition of a rebalance
                # (measured: a joining relay took 0.5-0.9 s per partition to rebuild 2,500
                # ops).
                "fetch.wait.max.ms": 10,
            }
        )
        try:  # warm: its metadata and connection now, not in the first rebuild of a rebalance
            self._consumer.list_topics(topic, timeout=10)  # (measured: 0.8 s there otherwise)
        except KafkaException as err:
            log.warning("op history reader not warmed up (%s); it connects on first use", err)

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
    parked: Mapping[str, OpRecord] | None = None,
    max_held_records: int,
) -> PartitionState:
    """The state of a partition pair whose progress was committed as ``progress``;
    ``log_end`` is the half partition's end, just read from the broker."""
    ops = history.read(partition, max(progress.rebuild_from, 0), progress.op_offset)
    state = restore(
        progress,
        ops,
        partition=partition,
        log_end=log_end,
        parked=parked,
        max_held_records=max_held_records,
    )
    log.info(
        "partition %d rebuilt: half from %d, op from %d (decisions re-learnt from op %d: %d); "
        "%d parked",
        partition,
        progress.half_offset,
        progress.op_offset,
        progress.rebuild_from,
        len(state.decided),
        len(state.parked),
        extra=fields(partition=partition),
    )
    return state


class Rebuilder:
    """Rebuilds newly assigned partition pairs for one session, from its op history reader
    and the state topic.

    ``touch`` is called before each partition and at each step of the state topic's read: a
    long rebuild is progress, not a hang.
    """

    def __init__(
        self,
        history: OpHistory,
        settings: RelaySettings,
        touch: Callable[[], None],
        *,
        config: dict[str, Any],
        watermarks: Watermarks,
    ) -> None:
        self.history = history
        self.watermarks = watermarks
        self.settings = settings
        self.touch = touch
        self.config = config
        self._half = settings.topics.half

    def rebuild(
        self, consumer: Consumer, progress: dict[int, Progress]
    ) -> dict[int, PartitionState]:
        """The states of partition pairs committed as ``progress`` (the watermarks client says
        where their half partitions start and end now)."""
        if not progress:
            return {}
        parked: dict[int, dict[str, OpRecord]] = {p: {} for p in progress}
        remembered = read_state(
            self.config,
            self.settings.topics,
            StateOwner.RELAY,
            self.settings.group_id,
            progress,
            watermarks=self.watermarks,
            progress=self.touch,
        )
        for txn, (p, value) in remembered.items():
            if isinstance(value, Parked) and p in parked:
                parked[p][txn] = value.op
        states = {}
        for p, at in progress.items():
            self.touch()
            # the high watermark: copies put back in a transaction still open lie below it,
            # above the last stable offset the read_committed consumer would answer with
            low, end = self.watermarks.query(self._half, p, timeout=10)
            if at.half_offset < low:
                log.error(
                    "%s[%d]: offsets %d..%d were removed by retention before the relay read "
                    "them (lengthen the retention of the internal topics); going on from %d, "
                    "and a COMMIT naming them is dead-lettered",
                    self._half,
                    p,
                    at.half_offset,
                    low - 1,
                    low,
                    extra=fields(topic=self._half, partition=p),
                )
                at = dataclasses.replace(at, half_offset=int(low), gap=(at.half_offset, int(low)))
            states[p] = rebuild(
                self.history,
                p,
                at,
                log_end=int(end),
                parked=parked[p],
                max_held_records=self.settings.max_held_records,
            )
        return states

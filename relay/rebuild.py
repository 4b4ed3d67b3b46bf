"""Rebuilding a partition's state after (re)assignment, from committed offsets and the op topic."""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import OFFSET_INVALID, Consumer, TopicPartition

from outbox.errors import KafkaOperationError, ProtocolError
from outbox.protocol.op import decode_op
from relay.state import PartitionState

log = logging.getLogger("relay")


def rebuild(
    config: dict[str, Any], op_topic: str, partition: int, half_offset: int, op_offset: int
) -> PartitionState:
    """The state of a partition pair whose progress was committed at these offsets.

    Transactions decided before ``op_offset`` whose half records lie at or after ``half_offset``
    will be read again; they are remembered as decided so their halves are not taken as pending.
    """
    state = PartitionState(partition, half_position=max(half_offset, 0), op_done=max(op_offset, 0))
    if op_offset == OFFSET_INVALID or op_offset <= 0:
        return state
    reader = Consumer({**config, "group.id": f"outbox-relay-rebuild-{partition}"})
    try:
        reader.assign([TopicPartition(op_topic, partition, 0)])
        _scan(reader, op_topic, state, op_offset, half_offset)
    finally:
        reader.close()
    log.info(
        "partition %d rebuilt: half from %d, op from %d, %d decided transactions remembered",
        partition,
        half_offset,
        op_offset,
        len(state.decided),
    )
    return state


def _scan(
    reader: Consumer, topic: str, state: PartitionState, until: int, half_offset: int
) -> None:
    tp = TopicPartition(topic, state.partition)
    low, high = reader.get_watermark_offsets(tp, timeout=10)
    end = min(until, high)
    idle = 0
    while end > low:
        msg = reader.poll(1.0)
        if msg is None:
            # Compaction leaves gaps and transaction markers take offsets: trust the position.
            if reader.position([tp])[0].offset >= end:
                return
            idle += 1
            if idle > 30:
                raise KafkaOperationError(f"op partition {tp} could not be read up to {end}")
            continue
        if msg.error():
            continue
        offset = msg.offset() or 0
        if offset >= end:
            return
        try:
            op = decode_op(msg.key(), msg.value(), partition=state.partition, offset=offset)
        except ProtocolError:
            op = None
        if op is not None and max(op.half_offsets, default=-1) >= half_offset:
            state.remember(op.txn_id, op.state)
        if offset >= end - 1:
            return

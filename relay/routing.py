"""Routing what the consumer reads into the partitions' states: half records and op records
decoded, records that cannot be decoded kept as bad records (dead-lettered with the next batch),
and a read position out of range turned into a new session.
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from outbox.consumer_errors import ConsumerErrors
from outbox.errors import ProtocolError
from outbox.protocol.half import decode_half
from outbox.protocol.op import decode_op
from outbox.protocol.topics import TopicNames
from outbox.refused_settings import RefusedSettings
from relay.actions import BadRecord
from relay.partitions import Partitions
from relay.restart import Restart

log = logging.getLogger("relay")


class Router:
    """Hands each record the session's consumer reads to its partition's state."""

    def __init__(
        self,
        consumer: Consumer,
        names: TopicNames,
        partitions: Partitions,
        refused: RefusedSettings,
        group_id: str,
    ) -> None:
        """``refused``: which consumer errors end the relay (a setting the broker refuses);
        ``group_id``: the group a missing ACL would be on, to say what to grant
        (:mod:`outbox.consumer_errors`)."""
        self.consumer = consumer
        self.partitions = partitions
        self.refused = refused
        self.errors = ConsumerErrors("relay", group_id, (names.half, names.op), log)
        self._half = names.half  # once: compared for every record

    def route(self, msg: Message) -> None:
        """One record (or consumer event) from ``consume()``.

        Raises:
            Restart: a read position is out of range (see :meth:`out_of_range`).
            ConfigurationError: the broker refuses a setting of the consumer
                (:mod:`outbox.refused_settings`); no retry would pass it.
        """
        error = msg.error()
        if error is not None:
            if error.code() == KafkaError._AUTO_OFFSET_RESET:
                self.out_of_range(str(msg.topic()), int(msg.partition() or 0), error)
                return
            if error.code() == KafkaError._PARTITION_EOF:
                self.reached_end(msg)
            else:
                refusal = self.refused.error_for(error)
                if refusal is not None:
                    raise refusal
                self.errors.report(error, msg.topic())  # with what to grant, if an ACL
            return
        partition = msg.partition()
        state = self.partitions.states.get(partition) if partition is not None else None
        if state is None:
            return  # not co-assigned (both topics must have equal partition counts)
        offset = int(msg.offset() or 0)
        try:
            if msg.topic() == self._half:
                state.add_half(
                    decode_half(
                        value=msg.value(),
                        headers=msg.headers(),
                        partition=state.partition,
                        offset=offset,
                        timestamp_ms=msg.timestamp()[1],
                    )
                )
            else:
                op = decode_op(msg.key(), msg.value(), partition=state.partition, offset=offset)
                if op is not None and op.half_partition != state.partition:
                    raise ProtocolError(
                        f"op record at partition {state.partition} offset {offset} names half "
                        f"partition {op.half_partition}; a transaction's op and halves share one"
                    )
                state.add_op(offset, op, _stamp(msg))
        except ProtocolError as err:
            bad = _bad(msg, state.partition, offset, str(err))
            state.add_bad(bad, half=msg.topic() == self._half, timestamp_ms=_stamp(msg))

    def reached_end(self, msg: Message) -> None:
        """The consumer read a partition to its end: for an op partition, every op written so
        far was read (what put-back is measured on, :mod:`relay.op_frontier`); for a half
        partition, the reader passed any commit markers before the end."""
        self.errors.read_to_end(str(msg.topic()))  # a refusal of it is over
        state = self.partitions.states.get(int(msg.partition() or 0))
        if state is None:
            return
        if msg.topic() == self._half:
            state.half_read_to(int(msg.offset() or 0))
        else:
            state.op_frontier.reached_end()

    def out_of_range(self, topic: str, partition: int, error: KafkaError) -> None:
        """Start over. Below the log start, retention removed half or op records before they
        were read: the new session starts at the log start (see
        :meth:`relay.rebuild.Rebuilder.rebuild` and :mod:`relay.op_retention`); librdkafka
        cannot seek a partition its offset reset stopped. At or past the end, the broker
        shows less than was read before (right after a restart).

        Raises:
            Restart: always, for a partition held here.
        """
        state = self.partitions.states.get(partition)
        if state is None:
            return
        position = state.half_position if topic == self._half else state.op_read_position
        low, _ = self.consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=10, cached=False
        )
        removed = f"{topic}[{partition}]: offsets {position}..{low - 1} were removed"
        if position < low:
            raise Restart(f"{removed} by retention before the relay read them; going on at {low}")
        raise Restart(f"{topic}[{partition}] position {position} out of range: {error.str()}")


def _stamp(msg: Message) -> int | None:
    """The record's timestamp (the broker's, on topics made by ``topics ensure``), if any."""
    stamp = msg.timestamp()[1]
    return stamp if stamp >= 0 else None


def _bad(msg: Message, partition: int, offset: int, reason: str) -> BadRecord:
    pairs: list[tuple[str, Any]] = list(msg.headers() or [])  # type: ignore[arg-type]
    headers = tuple((n, v if isinstance(v, bytes) else (v or "").encode()) for n, v in pairs)
    return BadRecord(msg.topic() or "", partition, offset, msg.key(), msg.value(), headers, reason)

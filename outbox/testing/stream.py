"""Writes transactions straight onto the outbox topics, record by record, without the services.

For tests and benchmarks that need exact control of what is on the topics: what a producer,
the checker and the relay would write (halves, ops, put-back copies, promoted records, dead
letters), and what they must never write (a promotion after a ROLLBACK, a second different
decision, a record twice). It follows docs/protocol.md through :mod:`outbox.protocol`.

Typical use::

    stream = StreamWriter(bootstrap, prefix="__outbox-t1", partitions=3)
    txn = stream.begin([("orders", b"customer-1", b"{...}")])
    stream.flush()                       # the half offsets are known from here on
    stream.decide(txn, OpState.COMMIT)
    stream.promote(txn)
    stream.flush()
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from outbox.kafka_logging import log_to_python
from outbox.protocol.dead_letter import dead_letter_headers
from outbox.protocol.half import HalfMessage, encode_half_headers
from outbox.protocol.headers import Header
from outbox.protocol.ids import new_transaction_id
from outbox.protocol.op import OpRecord, encode_op
from outbox.protocol.partitioning import partition_for
from outbox.protocol.states import DecidedBy, OpState
from outbox.settings import OutboxSettings
from outbox.topics import ensure_topics

#: (real topic, key, value) of one message.
MessageSpec = tuple[str, bytes | None, bytes | None]


@dataclass
class StreamTxn:
    """One transaction as written: its id, group, partition, messages and half offsets."""

    txn_id: str
    group: str
    partition: int
    messages: list[HalfMessage]
    created_at_ms: int = 0
    offsets: dict[int, int] = field(default_factory=dict)
    #: The offsets of its op records, in the order written (after a flush).
    op_offsets: list[int] = field(default_factory=list)

    def half_offsets(self) -> tuple[int, ...]:
        """Offsets in message-index order; call after :meth:`StreamWriter.flush`."""
        return tuple(self.offsets[i] for i in range(len(self.messages)))


class StreamWriter:
    """A plain (idempotent, non-transactional) producer onto one set of outbox topics."""

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        prefix: str,
        partitions: int = 3,
        group: str = "g",
        producer_config: dict[str, Any] | None = None,
    ) -> None:
        self.settings = OutboxSettings(
            bootstrap_servers=bootstrap_servers,
            producer_group=group,
            topic_prefix=prefix,
            partitions=partitions,
        )
        ensure_topics(self.settings)
        self.topics = self.settings.topics
        self.group = group
        self.partitions = partitions
        self.errors: list[str] = []
        self.producer = Producer(
            log_to_python(
                {
                    "bootstrap.servers": bootstrap_servers,
                    "enable.idempotence": True,
                    "linger.ms": 20,
                    "batch.size": 1_000_000,
                    "queue.buffering.max.messages": 1_000_000,
                    "compression.type": "lz4",
                    **(producer_config or {}),
                }
            )
        )

    # -- what producers write --------------------------------------------------------------

    def begin(
        self,
        messages: Sequence[MessageSpec],
        *,
        txn_id: str | None = None,
        group: str | None = None,
        created_at_ms: int | None = None,
    ) -> StreamTxn:
        """Write the half records of a new transaction (partition from its first key)."""
        txn_id = txn_id or new_transaction_id()
        first_key = messages[0][1] if messages else None
        partition = partition_for(first_key or txn_id.encode(), self.partitions)
        created = created_at_ms if created_at_ms is not None else int(time.time() * 1000)
        txn = StreamTxn(
            txn_id,
            group or self.group,
            partition,
            [HalfMessage(topic, value, key) for topic, key, value in messages],
            created,
        )
        for index, message in enumerate(txn.messages):
            headers = encode_half_headers(
                txn_id=txn_id,
                producer_group=txn.group,
                message=message,
                index=index,
                count=len(txn.messages),
                created_at_ms=created,
            )
            self._produce(
                self.topics.half,
                txn_id.encode(),
                message.value,
                headers,
                partition,
                on_offset=lambda offset, i=index: txn.offsets.__setitem__(i, offset),
            )
        return txn

    def decide(
        self,
        txn: StreamTxn,
        state: OpState,
        *,
        decided_by: DecidedBy = DecidedBy.PRODUCER,
        reason: str | None = None,
        offsets: tuple[int, ...] | None = None,
    ) -> None:
        """Write an op record for ``txn`` (its halves must have been flushed)."""
        key, value = self._op(txn, state, decided_by, reason, offsets)
        self._produce(
            self.topics.op, key, value, None, txn.partition, on_offset=txn.op_offsets.append
        )

    def _op(
        self,
        txn: StreamTxn,
        state: OpState,
        decided_by: DecidedBy,
        reason: str | None,
        offsets: tuple[int, ...] | None,
    ) -> tuple[bytes, bytes]:
        op = OpRecord(
            txn_id=txn.txn_id,
            state=state,
            producer_group=txn.group,
            half_partition=txn.partition,
            half_offsets=offsets if offsets is not None else txn.half_offsets(),
            decided_by=decided_by,
            decided_at_ms=int(time.time() * 1000),
            reason=reason,
        )
        return encode_op(op)

    # -- what the relay and the checker write ----------------------------------------------

    def put_back(self, txn: StreamTxn, index: int) -> None:
        """A put-back copy of one half record (origin offset set, check count raised)."""
        message = txn.messages[index]
        headers = encode_half_headers(
            txn_id=txn.txn_id,
            producer_group=txn.group,
            message=message,
            index=index,
            count=len(txn.messages),
            created_at_ms=txn.created_at_ms,
            check_count=1,
        )
        headers.append((Header.ORIGIN_OFFSET.value, str(txn.offsets[index]).encode()))
        self._produce(self.topics.half, txn.txn_id.encode(), message.value, headers, txn.partition)

    def promote(
        self, txn: StreamTxn, indices: Sequence[int] | None = None, *, topic: str | None = None
    ) -> None:
        """Write messages of ``txn`` to their real topics as the relay does (all by default, in
        the order given)."""
        for index in indices if indices is not None else range(len(txn.messages)):
            message = txn.messages[index]
            headers = [
                *message.headers,
                (Header.TXN_ID.value, txn.txn_id.encode()),
                (Header.PRODUCER_GROUP.value, txn.group.encode()),
                (Header.MESSAGE_INDEX.value, str(index).encode()),
            ]
            self._produce(topic or message.topic, message.key, message.value, headers, None)

    def commit_and_promote(self, txns: Sequence[StreamTxn]) -> None:
        """COMMIT each of ``txns`` (their halves flushed), then promote them all, as producers
        and the relay do on the happy path; flushed."""
        for txn in txns:
            self.decide(txn, OpState.COMMIT)
        self.flush()
        for txn in txns:
            self.promote(txn)
        self.flush()

    def refuse(self, txn: StreamTxn, state: OpState, reason: str) -> None:
        """``txn``'s last op (written with :meth:`decide`, flushed) on the dead-letter topic, as
        the relay refuses one whose half records it cannot find (retention removed them): the
        op's own key and value, no half headers, where it came from."""
        key, value = self._op(txn, state, DecidedBy.PRODUCER, None, None)
        headers = dead_letter_headers(
            None,
            reason=reason,
            source_topic=self.topics.op,
            source_partition=txn.partition,
            source_offset=txn.op_offsets[-1],
        )
        self._produce(self.topics.dead_letter, key, value, headers, txn.partition)

    def dead_letter(self, txn: StreamTxn, reason: str) -> None:
        """The given-up transaction's half records on the dead-letter topic, as the checker
        parks them: whole, with the reason and where they came from."""
        for index, message in enumerate(txn.messages):
            original = encode_half_headers(
                txn_id=txn.txn_id,
                producer_group=txn.group,
                message=message,
                index=index,
                count=len(txn.messages),
                created_at_ms=txn.created_at_ms,
            )
            headers = dead_letter_headers(
                original,
                reason=reason,
                source_topic=self.topics.half,
                source_partition=txn.partition,
                source_offset=txn.offsets[index],
            )
            self._produce(
                self.topics.dead_letter, txn.txn_id.encode(), message.value, headers, txn.partition
            )

    def raw(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, str | bytes | None]] | None = None,
        partition: int | None = None,
    ) -> None:
        """Any record at all (for records the protocol does not allow)."""
        self._produce(topic, key, value, headers, partition)

    # -- plumbing --------------------------------------------------------------------------

    def _produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, str | bytes | None]] | None,
        partition: int | None,
        on_offset: Any = None,
    ) -> None:
        def delivered(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                self.errors.append(f"{topic}: {err.str()}")
            elif on_offset is not None:
                offset = msg.offset()
                if offset is None or offset < 0:
                    # librdkafka's report for a retried produce the broker had already
                    # written: delivered, offset unknown. An op naming it would be wrong.
                    self.errors.append(
                        f"{topic}[{msg.partition()}]: acknowledged without its offset (a "
                        "retried produce); the transaction's half offsets are unknown - "
                        "write it again as a new transaction"
                    )
                else:
                    on_offset(offset)

        kwargs: dict[str, Any] = {"key": key, "value": value, "on_delivery": delivered}
        if headers:
            kwargs["headers"] = list(headers)
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                self.producer.produce(topic, **kwargs)
                return
            except BufferError:
                self.producer.poll(0.05)

    def flush(self, timeout: float = 120.0) -> None:
        """Wait for every record; the half offsets of begun transactions are known after it.

        Raises:
            RuntimeError: a record was not acknowledged, or a half record was acknowledged
                without its offset (its transaction's half offsets are not known).
        """
        left = self.producer.flush(timeout)
        if left or self.errors:
            raise RuntimeError(f"{left} records unacknowledged; errors: {self.errors[:3]}")

    def close(self) -> None:
        self.producer.flush(30)

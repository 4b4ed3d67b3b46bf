"""Writing transactions straight onto the internal topics, as producers and the checker do."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from confluent_kafka import Message, Producer

from outbox import OutboxSettings
from outbox.protocol import (
    DecidedBy,
    HalfMessage,
    Header,
    OpRecord,
    OpState,
    decode_half,
    encode_half_headers,
    encode_op,
    new_transaction_id,
    partition_for,
)
from outbox.protocol.copies import copy_headers
from outbox.protocol.dead_letter import dead_letter_headers
from tests.kafka_helpers import read_to_end


def read_messages(bootstrap: str, topic: str, partition: int | None = None) -> list[Message]:
    """Every committed record of ``topic`` (or one partition of it), read to the end (EOF)."""
    return read_to_end(bootstrap, topic, None if partition is None else [partition])


@dataclass
class Written:
    txn_id: str
    partition: int
    offsets: list[int]
    values: list[bytes]
    dead_letter_offsets: list[int] = field(default_factory=list)


class Writer:
    """Half records, op records and dead letters of made-up transactions."""

    def __init__(self, settings: OutboxSettings, *, group: str = "orders") -> None:
        self.settings = settings
        self.names = settings.topics
        self.group = group
        self.producer = Producer({"bootstrap.servers": settings.bootstrap_servers})

    def halves(
        self,
        topic: str,
        values: list[bytes],
        *,
        key: bytes = b"customer-1",
        check_count: int = 0,
        schema_version: int = 2,
    ) -> Written:
        txn_id = new_transaction_id()
        partition = partition_for(key, self.settings.partitions)
        offsets: list[int] = []
        for index, value in enumerate(values):
            message = HalfMessage(topic, value, key)
            headers = encode_half_headers(
                txn_id=txn_id,
                producer_group=self.group,
                message=message,
                index=index,
                count=len(values),
                created_at_ms=int(time.time() * 1000),
                check_count=check_count,
                schema_version=schema_version,
            )
            self.producer.produce(
                self.names.half,
                key=txn_id.encode(),
                value=value,
                headers=headers,
                partition=partition,
                on_delivery=lambda err, msg: offsets.append(msg.offset()),
            )
            assert self.producer.flush(30) == 0  # one at a time: offsets in index order
        return Written(txn_id, partition, offsets, values)

    def op(
        self,
        txn: Written,
        state: OpState,
        *,
        by: DecidedBy = DecidedBy.PRODUCER,
        reason: str | None = None,
    ) -> None:
        op = OpRecord(
            txn_id=txn.txn_id,
            state=state,
            producer_group=self.group,
            half_partition=txn.partition,
            half_offsets=tuple(txn.offsets),
            decided_by=by,
            decided_at_ms=int(time.time() * 1000),
            reason=reason,
        )
        key, value = encode_op(op)
        self.producer.produce(self.names.op, key=key, value=value, partition=txn.partition)
        assert self.producer.flush(30) == 0

    def promote(self, txn: Written, topic: str) -> list[int]:
        """What the relay writes for a COMMIT: each message with the promoted-record headers."""
        offsets: list[int] = []
        for index, value in enumerate(txn.values):
            self.producer.produce(
                topic,
                key=b"customer-1",
                value=value,
                headers=[
                    (Header.TXN_ID.value, txn.txn_id.encode()),
                    (Header.PRODUCER_GROUP.value, self.group.encode()),
                    (Header.MESSAGE_INDEX.value, str(index).encode()),
                ],
                on_delivery=lambda err, msg: offsets.append(msg.offset()),
            )
        assert self.producer.flush(30) == 0
        return offsets

    def put_back(self, txn: Written) -> list[int]:
        """What the relay's put-back writes: a copy of each half with its origin offset."""
        copies: list[int] = []
        for msg in read_messages(self.settings.bootstrap_servers, self.names.half, txn.partition):
            if msg.key() != txn.txn_id.encode():
                continue
            record = decode_half(value=msg.value(), headers=msg.headers(), offset=msg.offset())
            self.producer.produce(
                self.names.half,
                key=msg.key(),
                value=msg.value(),
                headers=copy_headers(record),
                partition=txn.partition,
                on_delivery=lambda err, m: copies.append(m.offset()),
            )
        assert self.producer.flush(30) == 0
        return copies

    def give_up(self, txn: Written, reason: str = "still UNKNOWN after 15 checks") -> None:
        """What the checker's ``_give_up`` writes: each half whole on the dead-letter topic with
        the reason and its original offset, then a GIVEN_UP op."""
        halves = [
            m
            for m in read_messages(self.settings.bootstrap_servers, self.names.half, txn.partition)
            if m.key() == txn.txn_id.encode()
        ]
        for msg in halves:
            self.producer.produce(
                self.names.dead_letter,
                key=txn.txn_id.encode(),
                value=msg.value(),
                headers=dead_letter_headers(
                    msg.headers(),
                    reason=reason,
                    source_topic=self.names.half,
                    source_partition=txn.partition,
                    source_offset=decode_half(
                        value=None, headers=msg.headers(), offset=msg.offset()
                    ).original_offset,
                ),
                partition=txn.partition,
                on_delivery=lambda err, msg: txn.dead_letter_offsets.append(msg.offset()),
            )
        assert self.producer.flush(30) == 0
        self.op(txn, OpState.GIVEN_UP, by=DecidedBy.CHECKER, reason=reason)

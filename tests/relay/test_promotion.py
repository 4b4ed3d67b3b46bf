"""Promoted records built by the fast path (pre-encoded header parts, produced straight from
the half records) are byte for byte the ones the general path builds."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from outbox.protocol import DecidedBy, HalfMessage, HalfRecord, OpRecord, OpState, TopicNames
from outbox.protocol.headers import HALF_SCHEMA_VERSIONS
from outbox.protocol.record_size import (
    HEADER_FRAMING_BYTES,
    RECORD_FRAMING_BYTES,
    half_record_bytes,
)
from outbox.protocol.states import CheckBy
from relay.actions import Promote
from relay.log_ends import LogEnds
from relay.promotion import promoted, promoted_headers
from relay.writer import Writer

TXN = "01a203d8-301f-7701-b6f4-468000000001"
NAMES = TopicNames("__outbox")


def record(index: int, group: str = "g", *, key: bytes | None = b"k", count: int = 1) -> HalfRecord:
    return HalfRecord(
        txn_id=TXN,
        producer_group=group,
        message=HalfMessage(
            topic="orders",
            value=b"v%d" % index,
            key=key,
            headers=(("trace", b"\x00\xff"), ("trace", b"again"), ("empty", b"")),
        ),
        index=index,
        count=count,
        created_at_ms=0,
        check_count=0,
        partition=3,
        offset=index,
        timestamp_ms=0,
    )


@pytest.mark.parametrize("index", [0, 1, 63, 64, 1000, -1])
@pytest.mark.parametrize("group", ["g", "bestellungen-ü", "g" * 300])
def test_the_fast_headers_equal_the_general_ones(index: int, group: str) -> None:
    for _ in range(2):  # the second time from the cache of encoded groups
        assert promoted_headers(record(index, group)) == promoted(record(index, group)).headers


@pytest.mark.parametrize("schema_version", HALF_SCHEMA_VERSIONS)
@pytest.mark.parametrize("key", [None, b"", b"k" * 40])
@pytest.mark.parametrize("group", ["g", "g" * 249])
def test_a_promoted_record_is_smaller_than_the_producers_bound_of_its_half_record(
    schema_version: int, key: bytes | None, group: str
) -> None:
    """A relay with the producers' ``message.max.bytes`` promotes every half record they sent
    (outbox/protocol/record_size.py): the promoted record, counted as librdkafka does, never
    passes the bound the producer checked its half record against."""
    for index in (0, 63, 64, 49_589):
        half = record(index, group, key=key, count=index + 1)
        out = promoted(half)
        size = RECORD_FRAMING_BYTES + len(out.key or b"") + len(out.value or b"")
        size += sum(HEADER_FRAMING_BYTES + len(n.encode()) + len(v) for n, v in out.headers)
        bound = half_record_bytes(
            half.message,
            producer_group=group,
            schema_version=schema_version,
            check_by=CheckBy.EVIDENCE,
        )
        assert size < bound


class Producer:
    """Keeps what it is given; raises ``first`` from its first produce() call."""

    def __init__(self, first: BaseException | None = None) -> None:
        self.first = first
        self.sent: list[tuple[Any, ...]] = []

    def produce(self, topic: str, value: Any, key: Any, partition: int, cb: Any, **kw: Any):
        if self.first is not None:
            first, self.first = self.first, None
            raise first
        self.sent.append((topic, value, key, partition, kw["headers"]))

    def poll(self, timeout: float) -> int:
        return 0


def general(records: tuple[HalfRecord, ...]) -> list[tuple[Any, ...]]:
    """What the general path (:func:`promoted`, then ``Writer._produce``) produces."""
    producer = Producer()
    writer = Writer(NAMES, LogEnds(NAMES.half), group_id="relay")
    for r in records:
        writer._produce(producer, promoted(r), lambda err, msg: None, TXN)  # type: ignore[arg-type]
    return producer.sent


def promote(records: tuple[HalfRecord, ...]) -> Promote:
    op = OpRecord(TXN, OpState.COMMIT, "g", 3, tuple(range(len(records))), DecidedBy.PRODUCER, 0)
    return Promote(op, records)


@pytest.mark.parametrize("first", [None, BufferError("queue full")], ids=["plain", "queue-full"])
def test_the_writer_produces_promotions_as_the_general_path_does(
    first: BaseException | None,
) -> None:
    records = (record(0, count=3), record(1, key=None, count=3), record(2, count=3))
    producer = Producer(first)
    writer = Writer(NAMES, LogEnds(NAMES.half), group_id="relay")
    writer.emit(producer, 3, promote(records))  # type: ignore[arg-type]
    assert producer.sent == general(records)  # each once, a full queue retried


def test_a_promoted_record_the_client_refuses_is_noted_against_its_transaction() -> None:
    producer = Producer(KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)))
    producer.produce = _always_refusing  # type: ignore[method-assign]
    writer = Writer(NAMES, LogEnds(NAMES.half), group_id="relay")
    writer.begin()
    with pytest.raises(KafkaException):
        writer.emit(producer, 3, promote((record(0),)))  # type: ignore[arg-type]
    assert [txn for txn, _ in writer.failures] == [TXN]


def _always_refusing(*args: Any, **kwargs: Any) -> None:
    raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))

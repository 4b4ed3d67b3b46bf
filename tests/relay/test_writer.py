"""The writer's side of refusals (unit: a stand-in producer answers, nothing connects): what it
notes when a write is refused, and what that does to the next attempt."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from outbox.protocol import DecidedBy, HalfMessage, HalfRecord, OpRecord, OpState, TopicNames
from outbox.protocol.dead_letter import DeadLetterHeader
from relay.actions import Promote, PutBack, Reject
from relay.log_ends import LogEnds
from relay.writer import Writer

NAMES = TopicNames("__outbox")
TXN = "01a203d8-301f-7701-b6f4-468000000001"
TOO_LARGE = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)


class Report:
    """What confluent-kafka hands a delivery callback."""

    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self._at = (topic, partition, offset)

    def topic(self) -> str:
        return self._at[0]

    def partition(self) -> int:
        return self._at[1]

    def offset(self) -> int:
        return self._at[2]


class Producer:
    """Takes every record, or refuses those to ``refuse`` at once; keeps what it was given."""

    def __init__(self, refuse: str | None = None) -> None:
        self.refuse = refuse
        self.sent: list[tuple[str, Any, Any, int, Callable[..., None], Any]] = []

    def produce(
        self, topic: str, value: Any, key: Any, partition: int, on_delivery: Any, **kw: Any
    ):
        if topic == self.refuse:
            raise KafkaException(TOO_LARGE)
        self.sent.append((topic, value, key, partition, on_delivery, kw["headers"]))

    def poll(self, timeout: float) -> int:
        return 0


def half(offset: int) -> HalfRecord:
    return HalfRecord(
        txn_id=TXN,
        producer_group="g",
        message=HalfMessage(topic="orders", value=b"v", key=b"k"),
        index=0,
        count=1,
        created_at_ms=0,
        check_count=0,
        partition=3,
        offset=offset,
        timestamp_ms=0,
    )


def commit(offset: int = 9) -> OpRecord:
    return OpRecord(
        TXN, OpState.COMMIT, "g", 3, (0,), DecidedBy.PRODUCER, 0, partition=3, offset=offset
    )


@pytest.fixture
def writer() -> Writer:
    return Writer(NAMES, LogEnds(NAMES.half), group_id="outbox-relay")


def test_a_promoted_record_refused_in_its_delivery_report_is_noted_against_its_transaction(
    writer: Writer,
) -> None:
    producer = Producer()
    writer.begin()
    writer.emit(producer, 3, Promote(commit(), (half(0),)))  # type: ignore[arg-type]
    [(topic, _, _, _, on_delivery, _)] = producer.sent
    on_delivery(TOO_LARGE, Report(topic, 0, -1))
    # The abort hands them over once, for parking
    assert writer.refused(producer) == [(TXN, f"orders: {TOO_LARGE.str()}")]  # type: ignore[arg-type]
    assert writer.failures == []


def test_a_refused_put_back_copy_makes_its_transaction_unmovable(writer: Writer) -> None:
    producer = Producer(refuse=NAMES.half)
    writer.begin()
    with pytest.raises(KafkaException):
        writer.emit(producer, 3, PutBack((half(0),)))  # type: ignore[arg-type]
    assert TXN in writer.unmovable
    # nothing to park: the batch is redone without the copy
    assert [txn for txn, _ in writer.failures] == [None]


def test_a_copy_written_moves_the_known_end_of_its_half_partition(writer: Writer) -> None:
    producer = Producer()
    writer.emit(producer, 3, PutBack((half(0),)))  # type: ignore[arg-type]
    [(topic, _, _, partition, on_copied, _)] = producer.sent
    assert (topic, partition) == (NAMES.half, 3)
    on_copied(None, Report(topic, 3, 41))
    assert writer.ends.copies_end == {3: 42}


def test_a_refused_dead_letter_is_written_again_without_the_original(writer: Writer) -> None:
    producer = Producer()
    reject = Reject(commit(offset=9), "its half records were not found (retention?)")
    writer.emit(producer, 3, reject)  # type: ignore[arg-type]
    [(topic, value, _, _, on_delivery, _)] = producer.sent
    assert topic == NAMES.dead_letter and value is not None
    on_delivery(TOO_LARGE, Report(topic, 3, -1))  # the batch is aborted and redone
    writer.emit(producer, 3, reject)  # type: ignore[arg-type]
    (_, value, key, _, _, headers) = producer.sent[-1]
    assert (key, value) == (None, None)
    assert DeadLetterHeader.OMITTED.value in dict(headers)

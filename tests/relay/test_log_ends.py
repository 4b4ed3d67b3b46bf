"""``relay.log_ends``: an op waiting for half records the relay has not read asks the broker
whether they can exist at all. With a Kafka transaction open on the half partition (another
relay's put-back copies, until it commits or its transaction times out), the relay's
read_committed consumer answered with the last stable offset: below the half records producers
had acknowledged after the copies, and their COMMIT was dead-lettered as "past the end" - a
committed transaction never delivered."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from outbox.protocol import OpState
from outbox.watermarks import Watermarks
from relay.actions import Promote, Reject
from relay.log_ends import LogEnds
from relay.state import PartitionState
from tests.kafka_helpers import create_topic, open_transaction, unique
from tests.relay.test_state import half, op, take

pytestmark = pytest.mark.integration


def waiting_for(offset: int) -> PartitionState:
    """A partition whose reader has read nothing, and a COMMIT naming the half record at
    ``offset`` at the head of its queue."""
    state = PartitionState(0)
    state.add_op(0, op(0, OpState.COMMIT, (offset,), at=0))
    return state


def test_a_commit_naming_half_records_after_an_open_transaction_is_not_rejected(
    kafka_bootstrap: str,
) -> None:
    # Given a half partition with a Kafka transaction open at offset 0, and a producer's half
    # record acknowledged after it, at offset 1
    topic = unique("halves")
    create_topic(kafka_bootstrap, topic)
    opened = open_transaction(kafka_bootstrap, topic)
    consumer = watermarks = None
    try:
        producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
        producer.produce(topic, b"a half record", partition=0)
        assert producer.flush(30) == 0
        # and a relay whose consumer reads committed records and has not read that partition
        consumer = Consumer(
            {
                "bootstrap.servers": kafka_bootstrap,
                "group.id": unique("relay"),
                "isolation.level": "read_committed",
            }
        )
        watermarks = Watermarks({"bootstrap.servers": kafka_bootstrap})
        # When the COMMIT naming offset 1 has waited long enough to ask the broker
        state = waiting_for(1)
        end = LogEnds(topic, verify_after_s=0).verified_end(consumer, watermarks, 0, state)
        # Then the end is past the half record, and the COMMIT waits for the reader to read it
        assert end == 2
        assert take(state, verified_end=end).actions == []
        state.add_half(half(0, 1))
        assert [type(a) for a in take(state).actions] == [Promote]
        # (the consumer's own answer, the last stable offset, would have rejected it)
        stable = consumer.get_watermark_offsets(TopicPartition(topic, 0), 10, cached=False)[1]
        assert stable == 0
        assert [type(a) for a in take(waiting_for(1), verified_end=stable).actions] == [Reject]
    finally:
        opened.abort_transaction(30)
        for client in (consumer, watermarks):
            if client is not None:
                client.close()


def test_a_commit_naming_offsets_past_the_high_watermark_is_still_rejected(
    kafka_bootstrap: str,
) -> None:
    topic = unique("halves")
    create_topic(kafka_bootstrap, topic)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(topic, b"a half record", partition=0)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": unique("relay")})
    watermarks = Watermarks({"bootstrap.servers": kafka_bootstrap})
    try:
        state = waiting_for(5)
        end = LogEnds(topic, verify_after_s=0).verified_end(consumer, watermarks, 0, state)
        assert end == 1
        assert [type(a) for a in take(state, verified_end=end).actions] == [Reject]
    finally:
        consumer.close()
        watermarks.close()

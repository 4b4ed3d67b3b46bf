"""``outbox.watermarks``: where a partition ends for a client that reads committed records, when a
Kafka transaction is open on it (a relay's put-back copies on a half partition)."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from outbox.watermarks import Watermarks
from tests.kafka_helpers import create_topic, open_transaction, unique

pytestmark = pytest.mark.integration


def test_the_end_is_the_high_watermark_past_an_open_transaction(kafka_bootstrap: str) -> None:
    # Given a record, a Kafka transaction left open, and two records acknowledged after it
    topic = unique("halves")
    create_topic(kafka_bootstrap, topic)
    plain = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    plain.produce(topic, b"before", partition=0)
    assert plain.flush(30) == 0
    opened = open_transaction(kafka_bootstrap, topic)
    watermarks = committed = None
    try:
        for _ in range(2):
            plain.produce(topic, b"after", partition=0)
        assert plain.flush(30) == 0
        watermarks = Watermarks({"bootstrap.servers": kafka_bootstrap})
        committed = Consumer(
            {
                "bootstrap.servers": kafka_bootstrap,
                "group.id": unique("relay"),
                "isolation.level": "read_committed",
            }
        )
        # Then the end is past every record (the two acknowledged ones included), where a
        # read_committed consumer's own query stops at the open transaction
        assert watermarks.query(topic, 0, timeout=10) == (0, 4)
        stable = committed.get_watermark_offsets(TopicPartition(topic, 0), 10, cached=False)
        assert stable == (0, 1)
    finally:
        opened.abort_transaction(30)
        for client in (committed, watermarks):
            if client is not None:
                client.close()

"""``outbox.watermarks``: where a partition ends for a client that reads committed records, when a
Kafka transaction is open on it (a relay's put-back copies on a half partition)."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from outbox.watermarks import Watermarks
from tests.kafka_helpers import add_partitions, create_topic, open_transaction, unique

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


def test_a_query_the_clients_metadata_cannot_answer_is_asked_again_by_a_fresh_client(
    kafka_bootstrap: str,
) -> None:
    # Given a client that has learnt a topic's one partition, and the topic grown to three
    # afterwards: its metadata lacks the new partitions, and librdkafka fails a query of them
    # without asking a broker, as it did for a checker's client after brokers were killed
    topic = unique("halves")
    create_topic(kafka_bootstrap, topic)
    watermarks = Watermarks({"bootstrap.servers": kafka_bootstrap}, renew_after_s=0)
    try:
        assert watermarks.query(topic, 0, timeout=10) == (0, 0)
        add_partitions(kafka_bootstrap, topic, 3)
        producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
        producer.produce(topic, b"x", partition=2)
        assert producer.flush(30) == 0
        # When the new partition's watermarks are asked twice
        with pytest.raises(KafkaException) as failed:
            watermarks.query(topic, 2, timeout=10)
        assert failed.value.args[0].code() == KafkaError._UNKNOWN_PARTITION
        answer = watermarks.query(topic, 2, timeout=10)
        # Then the first query failed, and replaced the stale client by one that answers
        assert answer == (0, 1)
        assert watermarks.renewals == 1
    finally:
        watermarks.close()


def test_a_failing_client_is_replaced_at_most_once_per_renew_after(kafka_bootstrap: str) -> None:
    # Given a client that was just made, and a partition that does not exist
    topic = unique("halves")
    create_topic(kafka_bootstrap, topic)
    watermarks = Watermarks({"bootstrap.servers": kafka_bootstrap}, renew_after_s=60)
    try:
        # When it is asked for it twice, Then both fail, and no fresh client was made
        for _ in range(2):
            with pytest.raises(KafkaException):
                watermarks.query(topic, 5, timeout=3)
        assert watermarks.renewals == 0
    finally:
        watermarks.close()

"""The broker the harness starts is a real Kafka: plain, transactional and compacted topics."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import ConfigResource

from tests.kafka_helpers import admin_client, create_topic, read_partition, unique

pytestmark = pytest.mark.integration


def test_produced_records_are_consumed_in_order(kafka_bootstrap: str) -> None:
    topic = unique("smoke")
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    for i in range(100):
        producer.produce(topic, f"m{i}".encode())
    assert producer.flush(30) == 0
    values = read_partition(kafka_bootstrap, topic, isolation="read_uncommitted")
    assert values == [f"m{i}".encode() for i in range(100)]


def test_read_committed_consumer_sees_committed_but_not_aborted_records(
    kafka_bootstrap: str,
) -> None:
    topic = unique("txn")
    create_topic(kafka_bootstrap, topic)
    producer = Producer(
        {"bootstrap.servers": kafka_bootstrap, "transactional.id": unique("smoke-txn")}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, f"committed-{i}".encode())
    producer.commit_transaction(30)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, f"aborted-{i}".encode())
    producer.flush(30)
    producer.abort_transaction(30)

    committed = read_partition(kafka_bootstrap, topic, isolation="read_committed")
    everything = read_partition(kafka_bootstrap, topic, isolation="read_uncommitted")

    assert committed == [f"committed-{i}".encode() for i in range(5)]
    assert sorted(everything) == sorted(
        [f"committed-{i}".encode() for i in range(5)] + [f"aborted-{i}".encode() for i in range(5)]
    )


def test_broker_reports_the_compaction_policy_a_topic_was_created_with(
    kafka_bootstrap: str,
) -> None:
    admin = admin_client(kafka_bootstrap)
    topic = unique("compacted")
    create_topic(
        kafka_bootstrap,
        topic,
        partitions=3,
        config={"cleanup.policy": "compact", "min.compaction.lag.ms": "60000"},
    )
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    config = admin.describe_configs([resource])[resource].result(30)
    metadata = admin.list_topics(topic, timeout=30).topics[topic]

    assert config["cleanup.policy"].value == "compact"
    assert config["min.compaction.lag.ms"].value == "60000"
    assert len(metadata.partitions) == 3

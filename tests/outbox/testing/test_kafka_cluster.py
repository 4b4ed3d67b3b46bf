"""The three-broker cluster fixture: replicated as production runs Kafka, and its helpers."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import ConfigResource, ResourceType

from outbox.testing.kafka_cluster import KafkaCluster, java_string_hash
from tests.kafka_helpers import admin_client


@pytest.mark.parametrize(
    ("text", "expected"),
    [("", 0), ("hello", 99162322), ("polygenelubricants", -2147483648), ("é€", 233 * 31 + 8364)],
)
def test_java_string_hash_is_javas_string_hash_code(text: str, expected: int) -> None:
    # Values from Java's "...".hashCode(); the third is Integer.MIN_VALUE.
    assert java_string_hash(text) == expected


@pytest.mark.integration
@pytest.mark.cluster
def test_every_topic_of_the_cluster_has_three_replicas_and_needs_two_in_sync(
    kafka_cluster: KafkaCluster,
) -> None:
    # Given a transaction committed with offsets, so both internal topics exist
    producer = Producer({"bootstrap.servers": kafka_cluster.bootstrap, "transactional.id": "rf3"})
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce("rf3-data", b"v")
    producer.commit_transaction(60)
    admin = admin_client(kafka_cluster.bootstrap)
    topics = admin.list_topics(timeout=30).topics
    # Then every partition of every topic, internal ones included, has three replicas
    assert {"__consumer_offsets", "__transaction_state", "rf3-data"} <= set(topics)
    replicas = {
        f"{name}[{p}]": len(part.replicas)
        for name, topic in topics.items()
        for p, part in topic.partitions.items()
    }
    assert set(replicas.values()) == {3}, replicas
    # And a write needs two of them in sync
    for name in ("__transaction_state", "rf3-data"):
        resource = ConfigResource(ResourceType.TOPIC, name)
        config = admin.describe_configs([resource])[resource].result(30)
        assert config["min.insync.replicas"].value == "2", name

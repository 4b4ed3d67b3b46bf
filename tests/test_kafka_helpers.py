"""The tests' own Kafka helpers do what the tests that lean on them assume."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import ConfigResource, ResourceType

from tests.kafka_helpers import admin_client, create_topic, set_topic_config, unique

pytestmark = pytest.mark.integration


@pytest.mark.scale  # 100 fresh topics, ~18 s: the race it guards showed in 1 of 150
def test_a_topic_setting_is_in_force_when_set_topic_config_returns(kafka_bootstrap: str) -> None:
    """Tests that make the broker refuse a send (``max.message.bytes``) send at once after the
    change, so the broker must have the new setting by then. The controller acknowledges a change
    before the broker has replayed it; before the helper waited for the broker, a DescribeConfigs
    sent at once read the old value for 1 of 150 fresh topics on a quiet machine (4 of 200 under
    load), and a CI run's half send met the old limit (``DID NOT RAISE HalfSendError``). One
    broker here: with several, the helper's wait covers the broker it asks, not each leader."""
    admin = admin_client(kafka_bootstrap)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    refusals: list[KafkaError | None] = []

    def delivered(err: KafkaError | None, _msg: Message) -> None:
        refusals.append(err)

    stale, created = [], []
    rounds = 100
    try:
        for i in range(rounds):
            topic = unique("setting")
            create_topic(bootstrap=kafka_bootstrap, name=topic, partitions=3)
            created.append(topic)
            set_topic_config(kafka_bootstrap, topic, "max.message.bytes", str(2048 + i))
            resource = ConfigResource(ResourceType.TOPIC, topic)
            described = admin.describe_configs([resource])[resource].result(10)
            if described["max.message.bytes"].value != str(2048 + i):
                stale.append((topic, described["max.message.bytes"].value))
            producer.produce(topic, b"x" * 5000, key=str(i).encode(), on_delivery=delivered)
            assert producer.flush(30) == 0
    finally:
        for future in admin.delete_topics(created).values():
            future.result(30)
    assert stale == [], f"{len(stale)} of {rounds} topics read their old setting: {stale[:3]}"
    accepted = sum(1 for err in refusals if err is None)
    assert accepted == 0, f"{accepted} of {rounds} records over the new limit were taken"
    assert {err.code() for err in refusals if err is not None} == {KafkaError.MSG_SIZE_TOO_LARGE}

"""The tests' own Kafka helpers do what the tests that lean on them assume."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from tests.kafka_helpers import create_topic, set_topic_config, unique

pytestmark = pytest.mark.integration


def test_a_topic_setting_is_in_force_when_set_topic_config_returns(kafka_bootstrap: str) -> None:
    """Tests that make the broker refuse a send (``max.message.bytes``) send at once after the
    change, so the broker must have the new setting by then. The controller acknowledges a change
    before the broker has replayed it; before the helper waited for the broker, a DescribeConfigs
    sent at once read the old value in a few rounds in a hundred under load, and a CI run's
    half send met the old limit (``DID NOT RAISE HalfSendError``)."""
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    stale = []
    rounds = 150
    for i in range(rounds):
        topic = unique("setting")
        create_topic(bootstrap=kafka_bootstrap, name=topic, partitions=3)
        set_topic_config(kafka_bootstrap, topic, "max.message.bytes", str(2048 + i))
        resource = ConfigResource(ResourceType.TOPIC, topic)
        value = admin.describe_configs([resource])[resource].result(10)["max.message.bytes"].value
        if value != str(2048 + i):
            stale.append((topic, value))
    assert stale == [], f"{len(stale)} of {rounds} topics read their old setting: {stale[:3]}"

"""The half partitions' end offsets, which a checker must have before it writes a COMMIT, come
from its consumer when the admin client cannot give them: on a three-broker cluster under kill
-9, librdkafka's admin client answered FENCED_LEADER_EPOCH for 15 minutes and a checker that
asked only it never applied its answers (docs/clusters.md). Here the admin client that cannot
answer is one whose broker is gone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from checker.end_offsets import end_offsets
from outbox.kafka_logging import log_to_python
from tests.kafka_helpers import create_topic, unique

pytestmark = pytest.mark.integration


@pytest.fixture
def topic(kafka_bootstrap: str) -> str:
    """Two partitions holding 3 and 0 records."""
    name = unique("halves")
    create_topic(kafka_bootstrap, name, partitions=2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for _ in range(3):
        producer.produce(name, b"x", partition=0)
    assert producer.flush(30) == 0
    return name


@pytest.fixture
def consumer(kafka_bootstrap: str) -> Iterator[Consumer]:
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": unique("checker")})
    yield consumer
    consumer.close()


def test_end_offsets_come_from_the_admin_client(
    kafka_bootstrap: str, topic: str, consumer: Consumer
) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    assert end_offsets(admin, consumer, topic, {0, 1}, timeout=10) == {0: 3, 1: 0}


def test_partitions_the_admin_client_cannot_answer_for_are_asked_of_the_consumer(
    topic: str, consumer: Consumer
) -> None:
    # Given an admin client whose every request fails (no broker answers at its address)
    gone = AdminClient(
        log_to_python(
            {"bootstrap.servers": "127.0.0.1:9", "socket.connection.setup.timeout.ms": 1000}
        )
    )
    # When the ends are asked, Then the consumer gives them
    assert end_offsets(gone, consumer, topic, {0, 1}, timeout=3) == {0: 3, 1: 0}

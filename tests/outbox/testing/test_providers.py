"""Both providers stay alive: one class of round trips pinned to each."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa
from confluent_kafka import Consumer, Producer, TopicPartition

from outbox.testing import RunningService

pytestmark = pytest.mark.integration


def _kafka_round_trip(bootstrap: str) -> bytes | None:
    topic = f"provider-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, b"hello")
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        msg = consumer.poll(15)
        return None if msg is None else msg.value()
    finally:
        consumer.close()


def _server_version(url: str) -> str:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return str(conn.execute(sa.text("SHOW server_version")).scalar_one())
    finally:
        engine.dispose()


@pytest.mark.provider_local
class TestLocalProcessProvider:
    def test_kafka_runs_as_a_local_process_and_round_trips(self, local_kafka: RunningService):
        assert local_kafka.provider == "local"
        assert _kafka_round_trip(local_kafka.address) == b"hello"

    def test_postgres_runs_as_a_local_process_and_answers(self, local_postgres: RunningService):
        assert local_postgres.provider == "local"
        assert _server_version(local_postgres.address)[:2].isdigit()


@pytest.mark.provider_containers
class TestContainersProvider:
    def test_kafka_runs_in_a_container_and_round_trips(self, container_kafka: RunningService):
        assert container_kafka.provider == "containers"
        assert _kafka_round_trip(container_kafka.address) == b"hello"

    def test_postgres_runs_in_a_container_and_answers(self, container_postgres: RunningService):
        assert container_postgres.provider == "containers"
        assert _server_version(container_postgres.address)[:2].isdigit()

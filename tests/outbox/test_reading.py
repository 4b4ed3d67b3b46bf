"""consume_ready: a batch read returns what arrived instead of waiting out its timeout."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from outbox.errors import ConfigurationError
from outbox.reading import consume_ready
from tests.kafka_helpers import create_topic, unique

pytestmark = pytest.mark.integration


@pytest.fixture
def topic(kafka_bootstrap: str) -> str:
    name = unique("reading")
    create_topic(kafka_bootstrap, name)
    return name


@pytest.fixture
def consumer(kafka_bootstrap: str, topic: str) -> Iterator[Consumer]:
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": unique("reading"),
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    yield consumer
    consumer.close()


def produce(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(count):
        producer.produce(topic, b"%d" % i)
    assert producer.flush(30) == 0


def _timed(consumer: Consumer, most: int, timeout: float) -> tuple[list[bytes], float]:
    started = time.monotonic()
    read = consume_ready(consumer, most, timeout)
    return [m.value() or b"" for m in read], time.monotonic() - started


def _batches(
    consumer: Consumer, count: int, most: int, timeout: float, within: float
) -> Iterator[tuple[list[bytes], float]]:
    """Each read's values and how long it took, until ``count`` records or ``within`` s."""
    read = 0
    deadline = time.monotonic() + within
    while read < count and time.monotonic() < deadline:
        values, took = _timed(consumer, most, timeout)
        read += len(values)
        yield values, took


def test_records_waiting_are_returned_without_waiting_out_the_timeout(
    kafka_bootstrap: str, topic: str, consumer: Consumer
) -> None:
    produce(kafka_bootstrap, topic, 3)
    read: list[bytes] = []
    for values, took in _batches(consumer, 3, 2000, 20.0, 30):  # a first fetch may split them
        read += values
        # consume(2000, 20.0) would have taken all 20 s with fewer than 2,000 records waiting
        assert took < 10, f"took {took:.1f} s for {len(values)} records"
    assert read == [b"0", b"1", b"2"]


def test_at_most_the_batch_and_nothing_when_nothing_arrives(
    kafka_bootstrap: str, topic: str, consumer: Consumer
) -> None:
    produce(kafka_bootstrap, topic, 5)
    read: list[bytes] = []
    while len(read) < 5:
        values, _ = _timed(consumer, 2, 20.0)
        assert 1 <= len(values) <= 2
        read += values
    assert read == [b"%d" % i for i in range(5)]
    values, took = _timed(consumer, 2000, 0.5)
    assert values == [] and took >= 0.4  # waited for a first record that never came


def test_thousands_waiting_come_in_batches_of_at_most_most_in_order(
    kafka_bootstrap: str, topic: str, consumer: Consumer
) -> None:
    produce(kafka_bootstrap, topic, 5000)
    read: list[bytes] = []
    for values, _ in _batches(consumer, 5000, 1000, 5.0, 60):
        assert len(values) <= 1000
        read += values
    assert read == [b"%d" % i for i in range(5000)]


@pytest.mark.parametrize("most", [0, -1, 1_000_001])
def test_a_batch_size_out_of_bounds_is_refused_by_name(most: int) -> None:
    consumer = Consumer({"bootstrap.servers": "127.0.0.1:1", "group.id": unique("reading")})
    try:
        with pytest.raises(ConfigurationError, match=rf"most={most} must be between 1 and"):
            consume_ready(consumer, most, 0.1)
    finally:
        consumer.close()

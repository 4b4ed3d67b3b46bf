"""A half topic grown by hand under a running deployment (README "Topics": the count is fixed for
good). Relays and checkers handle only the partitions the half and op topics both have, so a
producer that hashed transactions over the grown count would commit transactions nobody ever
promotes or checks. A new producer refuses before it sends or commits anything; one already
sending keeps the count it read, and everything it commits is delivered."""

from __future__ import annotations

from collections import Counter

import pytest
import sqlalchemy as sa
from confluent_kafka import Consumer, TopicPartition
from sqlalchemy.orm import sessionmaker

from outbox import (
    OutboxProducer,
    OutboxSettings,
    TopicMismatchError,
)
from outbox.protocol.partitioning import partition_for
from tests.kafka_helpers import add_partitions, unique, watermarks
from tests.outbox.forms import refused_in_every_other_form
from tests.pipeline import pipeline
from tests.producer_fixtures import Topics, order_ids, place_order

pytestmark = pytest.mark.integration

GROWN = 6  # outbox_settings makes 3


def test_a_new_producer_refuses_a_grown_half_topic_and_a_running_one_delivers_on_its_count(
    kafka_bootstrap: str,
    outbox_settings: OutboxSettings,
    topics: Topics,
    session_factory: sessionmaker,
    engine: sa.Engine,
    db_url: str,
) -> None:
    names = outbox_settings.topics
    # keys the grown count puts on partitions only the half topic has
    keys = [k for k in (f"key-{i}".encode() for i in range(100)) if partition_for(k, GROWN) >= 3]
    keys = keys[:4]
    attempted: list[str] = []

    def order(producer: OutboxProducer, topic: str, key: bytes) -> str:
        return place_order(producer, session_factory, topic, key, attempted)

    with pipeline(kafka_bootstrap, topics) as running_pipeline:
        topic = running_pipeline.topic
        with OutboxProducer(outbox_settings) as running:
            committed = [order(running, topic, b"before")]
            add_partitions(kafka_bootstrap, names.half, GROWN)

            with OutboxProducer(outbox_settings) as fresh:
                for key in keys:
                    with pytest.raises(TopicMismatchError) as refused:
                        order(fresh, topic, key)
                    message = str(refused.value)
                    assert f"{names.half} has {GROWN} partitions and {names.op} has 3" in message
                    assert "nothing was sent" in message
                # the other forms read the count through the same call
                refused_in_every_other_form(
                    fresh,
                    outbox_settings,
                    session_factory,
                    db_url,
                    topic,
                    keys,
                    attempted,
                    TopicMismatchError,
                )
            refused_ids = set(attempted) - set(committed)

            # the producer that was already sending keeps the count it read: partitions 0-2
            committed += [order(running, topic, key) for key in keys]
        delivered = running_pipeline.settle(lambda: set(committed))

    assert len(refused_ids) == len(keys) + 2  # the context manager's, a decorated and an async one
    assert delivered == Counter(committed)
    stored = set(order_ids(engine))
    assert set(committed) <= stored
    assert not refused_ids & stored
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": unique("marks")})
    try:
        grown_part = [watermarks(consumer, TopicPartition(names.half, p)) for p in range(3, GROWN)]
    finally:
        consumer.close()
    assert grown_part == [(0, 0)] * (GROWN - 3), "a half record was sent to a grown partition"

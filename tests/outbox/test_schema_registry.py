"""confluent-kafka's schema-registry serializers through the outbox, against a real registry
(Apicurio's Confluent-compatible API, started by the harness): values sent inside
``@outbox.transactional`` are registered under the REAL topic's subject, promoted by a real relay,
and read back from the real topic with the registry's deserializers."""

from __future__ import annotations

import json
import struct
import time
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka.serialization import MessageField, SerializationContext
from sqlalchemy.orm import Session, sessionmaker

import outbox
from outbox import OutboxProducer
from tests.kafka_helpers import create_topic, unique
from tests.pipeline import pipeline
from tests.producer_fixtures import Topics, order_ids, orders
from tests.relay.test_relay import read_topic

# The registry's clients import what the schema-registry extras install (authlib, httpx,
# fastavro, jsonschema): the dev extra has them; a producer install need not.
schema_registry = pytest.importorskip("confluent_kafka.schema_registry")
avro = pytest.importorskip("confluent_kafka.schema_registry.avro")
json_schema = pytest.importorskip("confluent_kafka.schema_registry.json_schema")

pytestmark = pytest.mark.integration

ORDER_AVRO = json.dumps(
    {
        "type": "record",
        "name": "Order",
        "namespace": "shop",
        "fields": [{"name": "id", "type": "string"}, {"name": "amount", "type": "int"}],
    }
)
ORDER_JSON_SCHEMA = json.dumps(
    {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Order",
        "type": "object",
        "properties": {"id": {"type": "string"}, "amount": {"type": "integer"}},
        "required": ["id", "amount"],
        "additionalProperties": False,
    }
)


@pytest.fixture
def db_url(sqlite_url: str) -> str:
    """SQLite only: what is checked here is serialization, which no database takes part in."""
    return sqlite_url


@pytest.fixture
def registry(schema_registry_url: str) -> Any:
    return schema_registry.SchemaRegistryClient({"url": schema_registry_url})


class Declined(Exception):
    pass


def order_transactions(
    producer: OutboxProducer, factory: sessionmaker[Session], **serializers: Any
) -> tuple[Any, Any]:
    """``place(topic, order)`` commits its row and message; ``decline(topic, order)`` sends the
    message, then rolls back."""

    @outbox.transactional(producer=producer, session_factory=factory)
    def place(topic: str, order: dict[str, Any], *, session: Session) -> None:
        session.execute(orders.insert().values(id=order["id"], amount=order["amount"]))
        outbox.send(topic, order, key=order["id"], **serializers)

    @outbox.transactional(producer=producer, session_factory=factory)
    def decline(topic: str, order: dict[str, Any], *, session: Session) -> None:
        session.execute(orders.insert().values(id=order["id"], amount=order["amount"]))
        outbox.send(topic, order, key=order["id"], **serializers)
        raise Declined(order["id"])

    return place, decline


def promoted(bootstrap: str, topic: str, count: int, timeout: float = 60) -> list[Any]:
    """The records a read_committed consumer reads from ``topic`` once ``count`` are there, and
    a little longer (a duplicate would show up then)."""
    deadline = time.monotonic() + timeout
    while len(read_topic(bootstrap, topic)) < count:
        assert time.monotonic() < deadline, f"fewer than {count} records on {topic}"
        time.sleep(0.5)
    time.sleep(2)
    return read_topic(bootstrap, topic)


def schema_id(framed: bytes) -> int:
    """The schema id in Confluent's wire format: magic byte 0, then the id (4 bytes, big-endian)."""
    assert framed[:1] == b"\x00", framed[:8]
    return int(struct.unpack(">I", framed[1:5])[0])


def test_avro_values_are_registered_under_the_real_topic_and_read_back_from_it(
    kafka_bootstrap: str,
    registry: Any,
    producer: OutboxProducer,
    session_factory: sessionmaker[Session],
    engine: sa.Engine,
    topics: Topics,
) -> None:
    serializer = avro.AvroSerializer(registry, ORDER_AVRO)
    place, decline = order_transactions(producer, session_factory, serializer=serializer)
    declined_topic = unique("orders-declined")
    create_topic(kafka_bootstrap, declined_topic)
    placed, declined = unique("order"), unique("order")
    with pipeline(kafka_bootstrap, topics) as running:
        # Given a committed order on one topic and a rolled-back one on another
        place(running.topic, {"id": placed, "amount": 5})
        with pytest.raises(Declined):
            decline(declined_topic, {"id": declined, "amount": 7})
        # When the relay has promoted what committed
        records = promoted(kafka_bootstrap, running.topic, 1)

    # Then the real topic has the committed order, which the registry's deserializer reads
    deserializer = avro.AvroDeserializer(registry)
    context = SerializationContext(running.topic, MessageField.VALUE)
    assert [deserializer(r.value(), context) for r in records] == [{"id": placed, "amount": 5}]
    assert [r.key() for r in records] == [placed.encode()]
    # and its schema is the one registered under the real topic's subject, not the half topic's
    subjects = registry.get_subjects()
    latest = registry.get_latest_version(f"{running.topic}-value")
    assert schema_id(records[0].value()) == latest.schema_id
    assert not [s for s in subjects if s.startswith(topics.settings.topic_prefix)], subjects
    # A rolled-back transaction delivered nothing, but serializing at send() registered its
    # schema all the same (docs/serializers.md: harmless)
    assert read_topic(kafka_bootstrap, declined_topic) == []
    assert f"{declined_topic}-value" in subjects
    assert placed in order_ids(engine) and declined not in order_ids(engine)


def test_json_schema_values_and_avro_keys_are_registered_under_the_real_topics_subjects(
    kafka_bootstrap: str,
    registry: Any,
    producer: OutboxProducer,
    session_factory: sessionmaker[Session],
    engine: sa.Engine,
    topics: Topics,
) -> None:
    value_serializer = json_schema.JSONSerializer(ORDER_JSON_SCHEMA, registry)
    key_serializer = avro.AvroSerializer(registry, '"string"')
    place, _ = order_transactions(
        producer, session_factory, serializer=value_serializer, key_serializer=key_serializer
    )
    first, second = sorted([unique("order"), unique("order")])
    with pipeline(kafka_bootstrap, topics) as running:
        place(running.topic, {"id": first, "amount": 9})
        place(running.topic, {"id": second, "amount": 1})
        records = promoted(kafka_bootstrap, running.topic, 2)

    value_context = SerializationContext(running.topic, MessageField.VALUE)
    key_context = SerializationContext(running.topic, MessageField.KEY)
    values = json_schema.JSONDeserializer(None, schema_registry_client=registry)
    keys = avro.AvroDeserializer(registry)
    read = sorted((keys(r.key(), key_context), values(r.value(), value_context)) for r in records)
    assert read == [(first, {"id": first, "amount": 9}), (second, {"id": second, "amount": 1})]
    value_schema = registry.get_latest_version(f"{running.topic}-value")
    key_schema = registry.get_latest_version(f"{running.topic}-key")
    assert {schema_id(r.value()) for r in records} == {value_schema.schema_id}
    assert {schema_id(r.key()) for r in records} == {key_schema.schema_id}
    assert json.loads(value_schema.schema.schema_str)["title"] == "Order"
    assert {first, second} <= set(order_ids(engine))

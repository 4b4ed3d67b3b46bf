"""A transaction of a second producer opened inside another's, on the same session.

A nested transaction joins the outer one, and a joined transaction sends through the outer
one's producer: its Kafka clients (cluster, half topic, relay), serializers and check endpoint.
So a second producer with the same settings and serializers (one made per module, say) joins,
while one that differs - another group, another cluster, another serializer - is refused naming
what differs: joined, its settings would be silently ignored, and its messages serialized for
other consumers or sent to a cluster its consumers do not read. The outer transaction then
rolls back.

Each scenario ends as the others in ``tests/outbox`` do: the rows and what a ``read_committed``
consumer reads from the real topic agree, one message per committed row.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

import outbox
from outbox import OutboxProducer
from outbox.settings import OutboxSettings
from tests.checker.test_checker import SECRET
from tests.kafka_helpers import unique
from tests.outbox.test_asyncio import async_factory
from tests.pipeline import pipeline
from tests.producer_fixtures import Topics, order_ids, orders

pytestmark = pytest.mark.integration


def json_bytes(value: object) -> bytes:
    return json.dumps(value).encode()


def other_group(settings: OutboxSettings) -> OutboxSettings:
    return dataclasses.replace(settings, producer_group=unique("billing"))


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_second_producer_joins_when_it_sends_alike_and_is_refused_naming_what_differs(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    session_factory: sessionmaker,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
) -> None:
    producer.serve_checks(engine=engine, secret=SECRET)
    committed: list[str] = []
    refused: list[str] = []

    with (
        pipeline(kafka_bootstrap, topics) as running,
        OutboxProducer(producer.settings) as twin,
        OutboxProducer(other_group(producer.settings)) as billing,
        OutboxProducer(producer.settings, serializer=json_bytes) as as_json,
    ):
        topic = running.topic

        def service(second: OutboxProducer) -> Callable[[str], None]:
            @outbox.transactional(producer=second, session_factory=session_factory)
            def record(order_id: str, *, session: Session) -> None:
                session.execute(orders.insert().values(id=order_id, amount=1))
                outbox.send(topic, order_id, key=order_id)

            return record  # type: ignore[return-value]  # session is the decorator's

        def outer_then(second: OutboxProducer, outer_id: str, nested_id: str) -> None:
            with producer.transaction(session_factory) as txn:
                assert txn.session is not None
                txn.session.execute(orders.insert().values(id=outer_id, amount=1))
                txn.send(topic, outer_id, key=outer_id)
                service(second)(nested_id)

        # Another producer object with the same settings and serializers joins: one COMMIT
        committed += [unique("outer-twin"), unique("nested-twin")]
        outer_then(twin, *committed[-2:])

        # One of another group, or with another serializer, is refused by name; the outer
        # transaction rolls back, its message sent before the refusal with it
        for second, differs in ((billing, "producer_group"), (as_json, "serializer")):
            refused += [unique(f"outer-{differs}"), unique(f"nested-{differs}")]
            with pytest.raises(outbox.ConfigurationError, match=f"in: {differs}[;,]"):
                outer_then(second, *refused[-2:])

        # The same in asyncio
        async def in_asyncio() -> None:

            def async_service(
                second: OutboxProducer, sessions: async_sessionmaker[AsyncSession]
            ) -> Callable[[str], Awaitable[None]]:
                @outbox.transactional(producer=second, session_factory=sessions)
                async def record(order_id: str, *, session: AsyncSession) -> None:
                    await session.execute(orders.insert().values(id=order_id, amount=1))
                    await outbox.send(topic, order_id, key=order_id)

                return record  # type: ignore[return-value]  # session is the decorator's

            async def outer_then_async(
                sessions: async_sessionmaker[AsyncSession], second: OutboxProducer, *ids: str
            ) -> None:
                outer_id, nested = ids
                async with producer.transaction(sessions) as txn:
                    assert txn.session is not None
                    await txn.session.execute(orders.insert().values(id=outer_id, amount=1))
                    await txn.send(topic, outer_id, key=outer_id)
                    await async_service(second, sessions)(nested)

            async with async_factory(db_url) as sessions:
                committed.extend([unique("async-outer-twin"), unique("async-nested-twin")])
                await outer_then_async(sessions, twin, *committed[-2:])
                refused.extend([unique("async-outer-billing"), unique("async-nested-billing")])
                with pytest.raises(outbox.ConfigurationError, match="in: producer_group; "):
                    await outer_then_async(sessions, billing, *refused[-2:])

        asyncio.run(in_asyncio())

        # Then every committed order has its row and its message once; the refused ones neither
        running.agree(order_ids(engine), committed, refused)


def test_what_a_second_producer_differs_in_is_named_field_by_field() -> None:
    """The comparison itself: the settings records depend on by value, serializers by equality
    (a function: the same one), the key's as ``send()`` picks it (no broker needed: a producer
    makes its Kafka clients on first use)."""
    from outbox.nesting import producer_differences

    settings = OutboxSettings(
        bootstrap_servers="127.0.0.1:9", producer_group="orders", topic_prefix="__outbox-x"
    )
    # the check endpoint's settings do not change the records (a rotated secret, another port)
    endpoint = dataclasses.replace(settings, check_secret="rotated", check_port=8081)
    with (
        OutboxProducer(settings) as first,
        OutboxProducer(dataclasses.replace(settings)) as alike,
        OutboxProducer(endpoint) as other_endpoint,
        OutboxProducer(settings, serializer=json_bytes) as values,
        OutboxProducer(settings, serializer=json_bytes, key_serializer=json_bytes) as both,
        OutboxProducer(
            dataclasses.replace(settings, topic_prefix="__outbox-y"), key_serializer=json_bytes
        ) as other,
    ):
        assert producer_differences(first, first) == []
        assert producer_differences(alike, first) == []
        assert producer_differences(other_endpoint, first) == []
        # a one-argument serializer serializes keys too: the same keys as given both ways
        assert producer_differences(both, values) == []
        assert producer_differences(values, first) == ["serializer", "key_serializer"]
        assert producer_differences(other, first) == ["topic_prefix", "key_serializer"]

"""Bad input gets a specific exception before anything is sent, and changes nothing."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import sessionmaker

import outbox
from outbox import OutboxProducer, OutboxSettings
from tests.outbox.test_asyncio import async_factory
from tests.producer_fixtures import Topics, order_ids, orders

pytestmark = pytest.mark.integration

BAD_SENDS: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("empty topic", {"topic": ""}, outbox.InvalidTopicError, "not a legal Kafka topic"),
    ("illegal character", {"topic": "orders/eu"}, outbox.InvalidTopicError, "contains '/'"),
    ("topic too long", {"topic": "t" * 250}, outbox.InvalidTopicError, "Kafka allows 249"),
    ("topic not a str", {"topic": 42}, outbox.InvalidTopicError, "must be a str"),
    ("internal topic", {"topic": "{prefix}-op"}, outbox.InternalTopicError, "internal prefix"),
    ("too large", {"value": b"x" * 2049}, outbox.MessageTooLargeError, "2049 bytes"),
    ("dict value", {"value": {"a": 1}}, outbox.SerializationError, "serializer="),
    ("int key", {"key": 7}, outbox.SerializationError, "key of type int"),
    ("header int value", {"headers": {"h": 1}}, outbox.SerializationError, "header 'h'"),
    ("reserved header", {"headers": {"outbox-x": "1"}}, outbox.InvalidHeaderError, "reserves"),
    ("delay", {"delay": 30}, outbox.DelayNotSupportedError, "not supported"),
]


@pytest.fixture
def small_producer(outbox_settings: OutboxSettings) -> Any:
    settings = OutboxSettings(
        bootstrap_servers=outbox_settings.bootstrap_servers,
        producer_group="orders",
        topic_prefix=outbox_settings.topic_prefix,
        partitions=3,
        max_message_bytes=2048,
    )
    with OutboxProducer(settings) as producer:
        yield producer


@pytest.mark.parametrize("form", ["def", "async def"])
@pytest.mark.parametrize(
    ("case", "change", "error", "message"), BAD_SENDS, ids=[c[0] for c in BAD_SENDS]
)
def test_bad_send_raises_its_own_error_and_sends_and_stores_nothing(
    small_producer: OutboxProducer,
    session_factory: sessionmaker,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
    case: str,
    change: dict[str, Any],
    error: type[Exception],
    message: str,
    form: str,
) -> None:
    order_id = f"order-{uuid.uuid4().hex[:12]}"
    args: dict[str, Any] = {"topic": "orders", "value": b"ok", "key": "k"} | change
    if isinstance(args["topic"], str):
        args["topic"] = args["topic"].replace("{prefix}", small_producer.settings.topic_prefix)

    if form == "def":

        @outbox.transactional(producer=small_producer, session_factory=session_factory)
        def place(*, session: Any) -> None:
            session.execute(orders.insert().values(id=order_id, amount=1))
            outbox.send(**args)

        with pytest.raises(error, match=message):
            place()
    else:

        async def place_async() -> None:
            async with async_factory(db_url) as factory:

                @outbox.transactional(producer=small_producer, session_factory=factory)
                async def place(*, session: AsyncSession) -> None:
                    await session.execute(orders.insert().values(id=order_id, amount=1))
                    await outbox.send(**args)

                await place()

        with pytest.raises(error, match=message):
            asyncio.run(place_async())
    assert order_id not in order_ids(engine)
    assert topics.halves() == []
    assert topics.ops() == []


def test_send_outside_a_transaction_is_refused() -> None:
    with pytest.raises(outbox.NoActiveTransactionError, match="outside a transaction"):
        outbox.send("orders", b"x")


def test_a_closed_producer_refuses_to_send(
    outbox_settings: OutboxSettings, session_factory: sessionmaker, topics: Topics
) -> None:
    producer = OutboxProducer(outbox_settings)
    producer.close()
    with (
        pytest.raises(outbox.ProducerClosedError, match="closed"),
        producer.transaction(session_factory) as txn,
    ):
        txn.send("orders", b"x")
    assert topics.halves() == []


def test_unknown_decorator_options_are_refused_at_decoration_time() -> None:
    with pytest.raises(outbox.ConfigurationError, match=r"undefined: retries.*producer"):

        @outbox.transactional(retries=3)  # type: ignore[call-overload]
        def place() -> None: ...


def test_a_decorated_function_without_configuration_says_how_to_configure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import outbox.decorator

    # whatever an earlier test (or the in-process demo) configured, this one has nothing
    monkeypatch.setattr(outbox.decorator, "_defaults", outbox.decorator._Defaults())

    @outbox.transactional
    def place() -> None: ...

    with pytest.raises(outbox.ConfigurationError, match=r"outbox.configure\(producer="):
        place()

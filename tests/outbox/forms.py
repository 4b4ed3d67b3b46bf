"""Each public form but the context manager, run once and expected to be refused.

A refusal decided before the local transaction (topics missing or mismatched) has to hold in
every form a user may call - the decorator, the RocketMQ-style producer, the asyncio context
manager and the asyncio RocketMQ-style producer - not only in the one a test was written for.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import sessionmaker

import outbox
from outbox import (
    AsyncTransactionalProducer,
    LocalTransactionState,
    Message,
    OutboxProducer,
    OutboxSettings,
    TransactionalProducer,
)
from tests.outbox.test_asyncio import async_factory
from tests.outbox.test_transactional_producer import Listener
from tests.producer_fixtures import orders


def refused_in_every_other_form(
    producer: OutboxProducer,
    settings: OutboxSettings,
    session_factory: sessionmaker,
    db_url: str,
    topic: str,
    keys: list[bytes],
    attempted: list[str],
    error: type[Exception],
    match: str = "",
) -> None:
    """One transaction in each of the four forms, each refused with ``error`` (its message
    matching ``match``); a RocketMQ-style listener is never called. ``keys``: four keys, one per
    form; the orders tried go into ``attempted``. The asyncio RocketMQ form gets a producer of
    its own from ``settings`` (a producer has one listener)."""
    listener = Listener(LocalTransactionState.COMMIT)
    sender = TransactionalProducer(producer, listener)
    with pytest.raises(error, match=match):
        sender.send_message_in_transaction([Message(topic, b"x", key=keys[0])], 1)
    assert listener.executed == []  # refused before the local transaction ran

    @outbox.transactional(producer=producer, session_factory=session_factory)
    def place(order_id: str, session: sa.orm.Session = outbox.INJECTED) -> None:
        attempted.append(order_id)
        session.execute(orders.insert().values(id=order_id, amount=1))
        outbox.send(topic, order_id, key=keys[1])

    with pytest.raises(error, match=match):
        place(f"order-{uuid.uuid4().hex[:12]}")

    async def place_async() -> None:
        order_id = f"order-{uuid.uuid4().hex[:12]}"
        attempted.append(order_id)
        async with async_factory(db_url) as factory, producer.transaction(factory) as txn:
            assert isinstance(txn.session, AsyncSession)
            await txn.session.execute(orders.insert().values(id=order_id, amount=1))
            await txn.send(topic, order_id, key=keys[2])

    with pytest.raises(error, match=match):
        asyncio.run(place_async())

    with OutboxProducer(settings) as own:
        async_listener = Listener(LocalTransactionState.COMMIT)
        async_sender = AsyncTransactionalProducer(own, async_listener)
        with pytest.raises(error, match=match):
            asyncio.run(
                async_sender.send_message_in_transaction(Message(topic, b"x", key=keys[3]), 1)
            )
        assert async_listener.executed == []

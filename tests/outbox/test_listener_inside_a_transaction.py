"""The RocketMQ form called inside another outbox transaction: a service function under
``@outbox.transactional`` that sends through a ``TransactionalProducer``, whose listener opens its
local transaction with ``producer.transaction(...)``.

RocketMQ's local transaction is the listener's own: its answer alone decides the op. Before, the
listener's ``producer.transaction(...)`` joined the caller's transaction (the current one in its
context), so its writes went with the caller's: when the caller then failed, they rolled back
while the listener's COMMIT delivered the message - a message with no row, on both databases.
Now the listener runs outside the caller's transaction, in both forms and on a worker thread.

Each scenario ends in a ``read_committed`` read of the real topic and a look at the rows: the
listener's order has its row and its message once, and the caller's failed order neither.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import sessionmaker

from outbox import (
    AsyncTransactionalProducer,
    LocalTransactionState,
    Message,
    OutboxProducer,
    OutboxSettings,
    TransactionalProducer,
)
from tests.checker.test_checker import SECRET
from tests.kafka_helpers import unique
from tests.outbox.test_asyncio import async_factory
from tests.outbox.test_interrupted import OrdersListener
from tests.pipeline import pipeline
from tests.producer_fixtures import Topics, order_ids, orders

pytestmark = pytest.mark.integration

COMMIT = LocalTransactionState.COMMIT


class Failed(Exception):
    """The caller's own work failing after the RocketMQ send returned."""


class PlacesThroughTheOutbox(OrdersListener):
    """Its local transaction is an outbox scope (no sends), as code written for the other forms
    would open it."""

    def __init__(self, producer: OutboxProducer, factory: sessionmaker) -> None:
        super().__init__(factory)
        self.producer = producer

    def execute_local_transaction(self, msg: Message, arg: str) -> LocalTransactionState:
        with self.producer.transaction(self.factory) as txn:
            assert txn.session is not None
            txn.session.execute(orders.insert().values(id=arg, amount=1))
        return COMMIT


class PlacesThroughTheOutboxAsync(OrdersListener):
    """The same as a coroutine listener; its check stays the plain one."""

    def __init__(
        self,
        producer: OutboxProducer,
        factory: async_sessionmaker[AsyncSession],
        sync_factory: sessionmaker,
    ) -> None:
        super().__init__(sync_factory)
        self.producer = producer
        self.async_factory = factory

    async def execute_local_transaction(self, msg: Message, arg: str) -> LocalTransactionState:
        async with self.producer.transaction(self.async_factory) as txn:
            assert txn.session is not None
            await txn.session.execute(orders.insert().values(id=arg, amount=1))
        return COMMIT


def test_a_listener_inside_another_transaction_runs_its_own_local_transaction(
    kafka_bootstrap: str,
    outbox_settings: OutboxSettings,
    producer: OutboxProducer,
    session_factory: sessionmaker,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
) -> None:
    producer.serve_checks(engine=engine, secret=SECRET)
    placed: list[str] = []  # committed, each with its message
    failed: list[str] = []  # the callers' own orders: neither row nor message

    with pipeline(kafka_bootstrap, topics) as running:
        topic = running.topic

        def message(order: str) -> Message:
            return Message(topic, order.encode(), key=order)

        # Given the synchronous form, called inside a transaction that then fails
        sender = TransactionalProducer(producer, PlacesThroughTheOutbox(producer, session_factory))
        placed.append(unique("listener"))
        failed.append(unique("caller"))
        with pytest.raises(Failed), producer.transaction(session_factory) as txn:
            result = sender.send_message_in_transaction(message(placed[-1]), placed[-1])
            assert result.local_transaction_state is COMMIT
            assert txn.session is not None
            txn.session.execute(orders.insert().values(id=failed[-1], amount=1))
            txn.send(topic, failed[-1], key=failed[-1])
            raise Failed
        # and inside one that then commits: the caller's order and the listener's both go
        placed += [unique("listener-of-committed"), unique("committed-caller")]
        with producer.transaction(session_factory) as txn:
            result = sender.send_message_in_transaction(message(placed[-2]), placed[-2])
            assert result.local_transaction_state is COMMIT
            assert txn.session is not None
            txn.session.execute(orders.insert().values(id=placed[-1], amount=1))
            txn.send(topic, placed[-1], key=placed[-1])

        # and the asyncio form, with a coroutine listener and with a plain one (a worker thread)
        others: list[OutboxProducer] = []

        def grouped(settings: OutboxSettings) -> OutboxProducer:
            others.append(OutboxProducer(settings))
            return others[-1]

        async def in_asyncio() -> None:
            async with async_factory(db_url) as factory:
                listeners = [
                    PlacesThroughTheOutboxAsync(producer, factory, session_factory),
                    PlacesThroughTheOutbox(producer, session_factory),
                ]
                for n, listener in enumerate(listeners):
                    # one listener per producer group, as in RocketMQ
                    group = dataclasses.replace(outbox_settings, producer_group=f"orders-{n}")
                    async_sender = AsyncTransactionalProducer(grouped(group), listener)
                    placed.append(unique(f"async-{type(listener).__name__}"))
                    failed.append(unique("async-caller"))
                    with pytest.raises(Failed):
                        async with producer.transaction(factory) as txn:
                            sent = await async_sender.send_message_in_transaction(
                                message(placed[-1]), placed[-1]
                            )
                            assert sent.local_transaction_state is COMMIT
                            assert txn.session is not None
                            insert = orders.insert().values(id=failed[-1], amount=1)
                            await txn.session.execute(insert)
                            await txn.send(topic, failed[-1], key=failed[-1])
                            raise Failed

        try:
            asyncio.run(in_asyncio())
        finally:
            for other in others:
                other.close()

        # Then each listener's order is committed and delivered once; the callers' neither
        running.agree(order_ids(engine), placed, failed)

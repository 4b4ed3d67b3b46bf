"""A scoped session given to the outbox: Flask-SQLAlchemy's ``db.session`` (a ``scoped_session``),
or an ``async_scoped_session`` keyed by the current task, as asyncio services keep one per request.

Such a registry is callable, like a factory, but it names the session of the current thread or
task, which the caller's code reaches through the registry too (``db.session.add(order)``). So
the outbox runs in that session as if the caller had passed it: it does not close it (the
caller's objects stay attached), and a nested transaction given it is refused when the
transaction it would join runs in another session. Joined anyway, the caller's writes through
the registry would miss the COMMIT that sends the messages: a message with no row.

Each scenario ends as the others in ``tests/outbox`` do: the rows in the database and what a
``read_committed`` consumer reads from the real topic agree, one message per committed row.
"""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import async_scoped_session, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, scoped_session, sessionmaker

import outbox
from outbox import OutboxProducer
from tests.checker.test_checker import SECRET
from tests.kafka_helpers import unique
from tests.outbox.test_asyncio import async_url
from tests.pipeline import pipeline
from tests.producer_fixtures import Topics, order_ids, orders

pytestmark = pytest.mark.integration


class Base(DeclarativeBase):
    pass


class Order(Base):
    __table__ = orders


class Declined(Exception):
    pass


def test_a_scoped_session_is_the_session_it_names_in_every_form(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    session_factory: sessionmaker,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
) -> None:
    producer.serve_checks(engine=engine, secret=SECRET)
    registry = scoped_session(sessionmaker(engine))
    committed: list[str] = []
    refused: list[str] = []

    with pipeline(kafka_bootstrap, topics) as running:
        topic = running.topic

        @outbox.transactional(producer=producer, session_factory=registry)
        def place(order_id: str, *, decline: bool = False) -> None:
            registry.add(Order(id=order_id, amount=1))  # the registry, as Flask code writes
            outbox.send(topic, order_id, key=order_id)
            if decline:
                raise Declined(order_id)

        # Given the registry as the decorator's factory and as the `with` block's session
        committed.append(unique("decorated"))
        place(committed[-1])
        # a call that raises rolls back, and leaves the open session usable for the next one
        refused.append(unique("declined"))
        with pytest.raises(Declined):
            place(refused[-1], decline=True)
        committed.append(unique("after-declined"))
        place(committed[-1])
        committed.append(unique("with"))
        with producer.transaction(registry) as txn:
            order = Order(id=committed[-1], amount=1)
            registry.add(order)
            txn.send(topic, order.id, key=order.id)
        # the transaction ran in the thread's session and left it open: the caller's object is
        # still attached, and reads its committed state through it
        assert txn.session is registry()
        assert order in registry() and order.amount == 1

        # A nested call through the same registry joins: one COMMIT for both
        committed += [unique("outer-same"), unique("nested-same")]
        with producer.transaction(registry) as txn:
            registry.add(Order(id=committed[-2], amount=1))
            txn.send(topic, committed[-2], key=committed[-2])
            place(committed[-1])

        # A nested call through the registry inside a transaction on another session is
        # refused, and the outer one rolls back: nothing is committed or delivered
        refused += [unique("outer-other"), unique("nested-other")]
        with (
            pytest.raises(outbox.ConfigurationError, match="another session"),
            producer.transaction(session_factory) as txn,
        ):
            assert txn.session is not None
            txn.session.execute(orders.insert().values(id=refused[-2], amount=1))
            txn.send(topic, refused[-2], key=refused[-2])
            place(refused[-1])
        registry.remove()

        # The same in asyncio, with a registry keyed by the current task
        async def in_asyncio() -> None:
            async_engine = create_async_engine(async_url(db_url))
            tasks = async_scoped_session(
                async_sessionmaker(async_engine), scopefunc=asyncio.current_task
            )

            @outbox.transactional(producer=producer, session_factory=tasks)
            async def place_async(order_id: str) -> None:
                tasks.add(Order(id=order_id, amount=1))
                await outbox.send(topic, order_id, key=order_id)

            try:
                committed.append(unique("async-decorated"))
                await place_async(committed[-1])
                committed.append(unique("async-with"))
                async with producer.transaction(tasks) as txn:
                    order = Order(id=committed[-1], amount=1)
                    tasks.add(order)
                    await txn.send(topic, order.id, key=order.id)
                assert txn.session is tasks()
                assert order in tasks()  # not closed: the caller's object still attached
                refused.append(unique("async-nested-other"))
                with pytest.raises(outbox.ConfigurationError, match="another session"):
                    async with producer.transaction(async_sessionmaker(async_engine)) as txn:
                        await txn.send(topic, refused[-1], key=refused[-1])
                        await place_async(refused[-1])
                await tasks.remove()
            finally:
                await async_engine.dispose()

        asyncio.run(in_asyncio())

        # Then every committed order has its row and its message once; the refused ones neither
        running.agree(order_ids(engine), committed, refused)


def test_a_scoped_session_of_the_other_form_is_refused_naming_the_form(
    producer: OutboxProducer, engine: sa.Engine
) -> None:
    """The registry's session decides the form, as a session given directly does."""
    registry = scoped_session(sessionmaker(engine))

    @outbox.transactional(producer=producer, session_factory=registry)
    async def place_async() -> None:
        pass

    with pytest.raises(outbox.WrongFormError, match="async def, but its session is a synchronous"):
        asyncio.run(place_async())
    registry.remove()

"""``@outbox.transactional`` on a function whose body would run after the transaction ended.

A callable that returns a coroutine, run inside a synchronous transaction, would have the
transaction commit empty, the session close, and the body run later outside any transaction, its
writes never committed (on SQLite, its session holding the write lock). An ``async def`` is
therefore an asyncio transaction (``tests/outbox/test_asyncio.py``); generator functions are
refused when decorated, and a call that returns an awaitable (from a synchronous transaction) or
a generator (from either form) anyway is refused, the transaction rolled back.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

import outbox
from outbox import ConfigurationError, OutboxProducer, WrongFormError
from outbox.protocol import OpState
from tests.outbox.test_asyncio import async_factory
from tests.producer_fixtures import Topics, order_ids, orders


async def place_async(order_id: str, *, session: Session) -> None:
    session.execute(orders.insert().values(id=order_id, amount=1))
    outbox.send("orders", order_id, key=order_id)


async def place_async_gen(order_id: str) -> AsyncIterator[str]:
    yield order_id


def place_gen(order_id: str) -> Iterator[str]:
    yield order_id


@pytest.mark.parametrize(
    "fn", [place_async, functools.partial(place_async, "o1")], ids=["async def", "partial"]
)
def test_a_coroutine_function_becomes_an_asyncio_transaction(fn: Any) -> None:
    assert inspect.iscoroutinefunction(outbox.transactional(fn))


def test_an_async_generator_function_is_refused_when_decorated() -> None:
    with pytest.raises(WrongFormError, match="async generator function"):
        outbox.transactional(place_async_gen)  # type: ignore[call-overload]


def test_a_generator_function_is_refused_when_decorated() -> None:
    with pytest.raises(ConfigurationError, match="generator function"):
        outbox.transactional(place_gen)


class AwaitableOrder:
    """Callable whose __call__ is async: the decorator cannot tell before it is called."""

    def __init__(self, order_id: str) -> None:
        self.order_id = order_id

    async def __call__(self, *, session: Session) -> None:
        session.execute(orders.insert().values(id=self.order_id, amount=1))


@pytest.mark.integration
@pytest.mark.filterwarnings("error::RuntimeWarning")  # "coroutine ... was never awaited"
def test_a_call_that_returns_an_awaitable_is_refused_and_nothing_commits_or_stays_locked(
    producer: OutboxProducer, session_factory: sessionmaker, engine: sa.Engine, topics: Topics
) -> None:
    place = outbox.transactional(producer=producer, session_factory=session_factory)(
        AwaitableOrder("awaitable-1")
    )
    with pytest.raises(WrongFormError, match=r"returned an awaitable.*async def"):
        place()
    assert "awaitable-1" not in order_ids(engine)
    assert topics.ops() == []
    # and the database is not left locked: another transaction writes at once
    with engine.begin() as conn:
        conn.execute(orders.insert().values(id="after-awaitable", amount=1))
    assert "after-awaitable" in order_ids(engine)


class GeneratingOrder:
    """Callable whose __call__ yields: the decorator cannot tell before it is called."""

    def __init__(self, order_id: str) -> None:
        self.order_id = order_id

    def __call__(self, *, session: Session) -> Iterator[None]:
        session.execute(orders.insert().values(id=self.order_id, amount=1))
        outbox.send("orders", self.order_id, key=self.order_id)
        yield


def sends_lazily(order_id: str, *, session: Session) -> Iterator[None]:
    """A plain def returning a generator expression: its sends run while it is iterated."""
    return (outbox.send("orders", each, key=each) for each in (order_id,))


def _assert_nothing_committed_or_locked(order_id: str, engine: sa.Engine, topics: Topics) -> None:
    assert order_id not in order_ids(engine)
    assert [op for op in topics.ops() if op.state is OpState.COMMIT] == []
    with engine.begin() as conn:  # and the database is not left locked
        conn.execute(orders.insert().values(id=f"after-{order_id}", amount=1))
    assert f"after-{order_id}" in order_ids(engine)


@pytest.mark.integration
@pytest.mark.parametrize(
    "make",
    [GeneratingOrder, functools.partial(functools.partial, sends_lazily)],
    ids=["__call__ yields", "returns a generator expression"],
)
def test_a_call_that_returns_a_generator_is_refused_and_nothing_commits_or_stays_locked(
    make: Any,
    producer: OutboxProducer,
    session_factory: sessionmaker,
    engine: sa.Engine,
    topics: Topics,
) -> None:
    order_id = f"generating-{make.__name__ if isinstance(make, type) else 'expression'}"
    place = outbox.transactional(producer=producer, session_factory=session_factory)(make(order_id))
    with pytest.raises(WrongFormError, match=r"returned a generator.*return a list"):
        place()
    _assert_nothing_committed_or_locked(order_id, engine, topics)


@pytest.mark.integration
@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_an_async_def_that_returns_a_generator_is_refused_and_nothing_commits(
    producer: OutboxProducer, db_url: str, engine: sa.Engine, topics: Topics
) -> None:
    async def scenario() -> None:
        async with async_factory(db_url) as factory:

            @outbox.transactional(producer=producer, session_factory=factory)
            async def place(order_id: str, *, session: Any) -> Any:
                await session.execute(orders.insert().values(id=order_id, amount=1))
                await outbox.send("orders", order_id, key=order_id)
                return (outbox.send("orders", each, key=each) for each in (order_id,))

            with pytest.raises(WrongFormError, match=r"returned a generator.*return a list"):
                await place("generating-async-1")

            @outbox.transactional(producer=producer, session_factory=factory)
            async def place_agen(order_id: str, *, session: Any) -> Any:
                async def later() -> AsyncIterator[None]:
                    await outbox.send("orders", order_id, key=order_id)
                    yield

                await session.execute(orders.insert().values(id=order_id, amount=1))
                return later()

            with pytest.raises(WrongFormError, match=r"returned an async generator"):
                await place_agen("generating-async-2")

    asyncio.run(scenario())
    _assert_nothing_committed_or_locked("generating-async-1", engine, topics)
    _assert_nothing_committed_or_locked("generating-async-2", engine, topics)

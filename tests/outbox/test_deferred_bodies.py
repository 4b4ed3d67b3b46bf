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
    """Callable whose __call__ yields: its body would run while the result is iterated."""

    def __init__(self, order_id: str) -> None:
        self.order_id = order_id

    def __call__(self, *, session: Session) -> Iterator[None]:
        session.execute(orders.insert().values(id=self.order_id, amount=1))
        outbox.send("orders", self.order_id, key=self.order_id)
        yield


def test_an_object_whose_call_yields_is_refused_when_decorated() -> None:
    with pytest.raises(ConfigurationError, match=r"GeneratingOrder.__call__.*generator function"):
        outbox.transactional(GeneratingOrder("o1"))


def places_then_returns_lazily(
    order_id: str, txn_ids: list[str], *, session: Session
) -> Iterator[str]:
    """A plain def that writes and sends, then returns a generator expression whose sends would
    run while it is iterated."""
    txn_ids.append(outbox.current_transaction().txn_id)
    session.execute(orders.insert().values(id=order_id, amount=1))
    outbox.send("orders", order_id, key=order_id)
    return (outbox.send("orders", each, key=each) for each in (f"{order_id}-later",))


def places_then_returns_a_started_generator(
    order_id: str, txn_ids: list[str], *, session: Session
) -> Iterator[str]:
    """The same, the generator already started, its clean-up failing when it is closed."""
    txn_ids.append(outbox.current_transaction().txn_id)
    session.execute(orders.insert().values(id=order_id, amount=1))
    outbox.send("orders", order_id, key=order_id)

    def rest() -> Iterator[str]:
        try:
            yield order_id
            outbox.send("orders", f"{order_id}-later", key=order_id)
        finally:
            raise RuntimeError("clean-up fails")

    started = rest()
    next(started)
    return started


def _assert_rolled_back(
    order_id: str, txn_ids: list[str], engine: sa.Engine, topics: Topics
) -> None:
    assert order_id not in order_ids(engine)
    [txn_id] = txn_ids
    assert [op.state for op in topics.ops() if op.txn_id == txn_id] == [OpState.ROLLBACK]
    with engine.begin() as conn:  # and the database is not left locked
        conn.execute(orders.insert().values(id=f"after-{order_id}", amount=1))
    assert f"after-{order_id}" in order_ids(engine)


@pytest.mark.integration
@pytest.mark.parametrize(
    "fn",
    [places_then_returns_lazily, places_then_returns_a_started_generator],
    ids=["a generator expression", "a started generator"],
)
def test_a_call_that_returns_a_generator_is_refused_and_its_transaction_rolled_back(
    fn: Any,
    producer: OutboxProducer,
    session_factory: sessionmaker,
    engine: sa.Engine,
    topics: Topics,
) -> None:
    order_id, txn_ids = f"generating-{fn.__name__[-9:]}", []
    place = outbox.transactional(producer=producer, session_factory=session_factory)(fn)
    with pytest.raises(WrongFormError, match=r"returned a generator.*rolled back.*list"):
        place(order_id, txn_ids)
    _assert_rolled_back(order_id, txn_ids, engine, topics)


@pytest.mark.integration
def test_an_async_def_that_returns_a_generator_is_refused_and_its_transaction_rolled_back(
    producer: OutboxProducer, db_url: str, engine: sa.Engine, topics: Topics
) -> None:
    txn_ids: dict[str, list[str]] = {"async-1": [], "async-2": []}

    async def scenario() -> None:
        async with async_factory(db_url) as factory:

            @outbox.transactional(producer=producer, session_factory=factory)
            async def place(order_id: str, *, session: Any) -> Any:
                txn_ids["async-1"].append(outbox.current_transaction().txn_id)
                await session.execute(orders.insert().values(id=order_id, amount=1))
                await outbox.send("orders", order_id, key=order_id)
                return (outbox.send("orders", each, key=each) for each in (order_id,))

            with pytest.raises(WrongFormError, match=r"returned a generator.*rolled back"):
                await place("generating-async-1")

            @outbox.transactional(producer=producer, session_factory=factory)
            async def place_agen(order_id: str, *, session: Any) -> Any:
                async def later() -> AsyncIterator[None]:
                    await outbox.send("orders", order_id, key=order_id)
                    yield

                txn_ids["async-2"].append(outbox.current_transaction().txn_id)
                await session.execute(orders.insert().values(id=order_id, amount=1))
                await outbox.send("orders", order_id, key=order_id)
                return later()

            with pytest.raises(WrongFormError, match=r"returned an async generator"):
                await place_agen("generating-async-2")

    asyncio.run(scenario())
    _assert_rolled_back("generating-async-1", txn_ids["async-1"], engine, topics)
    _assert_rolled_back("generating-async-2", txn_ids["async-2"], engine, topics)

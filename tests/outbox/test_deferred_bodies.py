"""``@outbox.transactional`` on a function whose body would run after the transaction ended.

A callable that returns a coroutine, run inside a synchronous transaction, would have the
transaction commit empty, the session close, and the body run later outside any transaction, its
writes never committed (on SQLite, its session holding the write lock). An ``async def`` is
therefore an asyncio transaction (``tests/outbox/test_asyncio.py``); generator functions are
refused when decorated, and a synchronous call that returns an awaitable anyway is refused.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

import outbox
from outbox import ConfigurationError, OutboxProducer, WrongFormError
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

"""An exception a signal handler raises while the outbox handles a COMMIT the database refused.

SQLite keeps a transaction whose COMMIT a deferred constraint refused open, with its write lock,
and SQLAlchemy returns its connection to the pool without a rollback; so the outbox closes the
session's connections (:func:`outbox.commit_failure.discard_connections`). Interrupted as that
handling began (Ctrl-C, a worker's timeout, a task's time limit; see
:mod:`tests.outbox.test_interrupted`), it did not: the connection went back to the pool still
in the refused transaction, and the thread's next transaction, given that connection, ran
inside it and was refused in turn (on another connection, it would wait for the lock). Here
every point of the refused transaction is interrupted, each followed by a clean transaction in
the same thread (asyncio: on the same engine), which must commit; then rows and messages agree,
each once. The synchronous and the asyncio scope each failed without the fix.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import sessionmaker

from outbox import OutboxProducer
from tests.checker.test_checker import SECRET
from tests.kafka_helpers import unique
from tests.outbox.test_asyncio import async_url
from tests.outbox.test_interrupted import Interrupt, Interrupted, traced, traced_async
from tests.pipeline import pipeline
from tests.producer_fixtures import Topics, order_ids, orders

pytestmark = [pytest.mark.integration, pytest.mark.scale]

Refused = dict[str, tuple[str | None, type[BaseException] | None]]


def foreign_keys_on(dbapi_connection: Any, _record: Any) -> None:
    """SQLite checks foreign keys only when asked, per connection."""
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def ledger() -> tuple[sa.MetaData, sa.Table]:
    """A child table whose parent is checked at COMMIT (deferred); the parent table stays empty."""
    metadata = sa.MetaData()
    parent = sa.Table(unique("parent"), metadata, sa.Column("id", sa.String, primary_key=True))
    child = sa.Table(
        unique("child"),
        metadata,
        sa.Column("id", sa.String, primary_key=True),
        sa.Column(
            "parent_id",
            sa.ForeignKey(parent.c.id, deferrable=True, initially="DEFERRED"),
            nullable=False,
        ),
    )
    return metadata, child


def each_point(place: Callable[..., None], count: int) -> tuple[Refused, dict[str, str]]:
    """A refused transaction interrupted at each of ``count`` points and one past the last,
    each followed by a clean one: what each refused one raised, and how each clean one ended."""
    refused: Refused = {}
    clean: dict[str, str] = {}
    for at in range(1, count + 2):
        order = f"at{at}-{uuid.uuid4().hex[:8]}"
        tracer = Interrupt(at, KeyboardInterrupt)
        raised = traced(tracer, functools.partial(place, order, True))
        refused[order] = (tracer.where, raised)
        after = f"after{at}-{uuid.uuid4().hex[:8]}"
        try:
            place(after, False)
            clean[after] = "committed"
        except Exception as err:
            clean[after] = f"{type(err).__name__} after the interrupt at {tracer.where}"
    return refused, clean


async def each_point_async(
    place: Callable[..., Coroutine[Any, Any, None]], count: int
) -> tuple[Refused, dict[str, str]]:
    """:func:`each_point` in asyncio, each refused transaction in a task of its own."""
    refused: Refused = {}
    clean: dict[str, str] = {}
    for at in range(1, count + 2):
        order = f"at{at}-{uuid.uuid4().hex[:8]}"
        tracer = Interrupt(at, Interrupted)
        raised = await traced_async(tracer, functools.partial(place, order, True))
        refused[order] = (tracer.where, raised)
        after = f"after{at}-{uuid.uuid4().hex[:8]}"
        try:
            await place(after, False)
            clean[after] = "committed"
        except Exception as err:
            clean[after] = f"{type(err).__name__} after the interrupt at {tracer.where}"
    return refused, clean


@pytest.mark.parametrize("form", ["with", "async with"])
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_interrupt_while_a_refused_commit_is_handled_leaves_nothing_for_the_next(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
    form: str,
) -> None:
    metadata, child = ledger()
    # a lock left behind fails the next transaction in 1 s, not SQLite's default 5 s
    strict = sa.create_engine(db_url, connect_args={"timeout": 1})
    sa.event.listen(strict, "connect", foreign_keys_on)
    metadata.create_all(strict)
    factory = sessionmaker(strict)
    producer.serve_checks(engine=engine, secret=SECRET)
    exc: type[BaseException] = KeyboardInterrupt if form == "with" else Interrupted

    with pipeline(kafka_bootstrap, topics) as running:
        topic = running.topic

        def place(order: str, refused: bool) -> None:
            with producer.transaction(factory) as txn:
                txn.send(topic, order, key=order)
                assert txn.session is not None
                txn.session.execute(orders.insert().values(id=order, amount=1))
                if refused:  # a child of no parent: the COMMIT is refused
                    txn.session.execute(child.insert().values(id=order, parent_id="none"))

        async def run_async() -> tuple[Refused, dict[str, str]]:
            async_strict = create_async_engine(async_url(db_url), connect_args={"timeout": 1})
            sa.event.listen(async_strict.sync_engine, "connect", foreign_keys_on)
            factory_async = async_sessionmaker(async_strict, expire_on_commit=False)

            async def place_async(order: str, refused: bool) -> None:
                async with producer.transaction(factory_async) as txn:
                    await txn.send(topic, order, key=order)
                    assert txn.session is not None
                    await txn.session.execute(orders.insert().values(id=order, amount=1))
                    if refused:
                        await txn.session.execute(child.insert().values(id=order, parent_id="none"))

            try:
                counting = Interrupt(None, exc)
                raised = await traced_async(counting, functools.partial(place_async, "count", True))
                assert raised is sa.exc.IntegrityError
                return await each_point_async(place_async, counting.points)
            finally:
                await async_strict.dispose()

        try:
            if form == "with":
                counting = Interrupt(None, exc)
                raised = traced(counting, functools.partial(place, "count", True))
                assert raised is sa.exc.IntegrityError
                refused, clean = each_point(place, counting.points)
            else:
                refused, clean = asyncio.run(run_async())
        finally:
            strict.dispose()
        # Then the caller got the interrupt, or the refusal past the last point
        odd = {
            o: m for o, m in refused.items() if m[1] is not (exc if m[0] else sa.exc.IntegrityError)
        }
        assert odd == {}
        # and each next transaction committed: nothing of the refused one was left to it
        assert {o: r for o, r in clean.items() if r != "committed"} == {}
        # and each refused transaction is decided (no row, no message), each clean one delivered
        running.decided({h.txn_id for h in topics.halves()}, timeout=180)
        rows = set(order_ids(engine))
        assert rows & set(refused) == set()
        assert set(clean) <= rows
        delivered = running.settle(lambda: set(clean), timeout=120)
        assert delivered == dict.fromkeys(clean, 1)

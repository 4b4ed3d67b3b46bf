"""A scope left without its exit running is never joined (``outbox.left_scopes``).

A signal handler's exception raised as a scope's exit begins (at the start of ``__aexit__``,
before any of its code) leaves the ``with`` or ``async with`` statement without ending the
transaction, which stays current in the caller's context. In asyncio its cleanup comes only on
the event loop's next turn, so a task going straight on to its next transaction (a worker's loop)
joined the dead one: that next transaction returned as if committed, and never was. These tests
leave a scope that way directly (entered, then dropped), or raise at the start of its exit and
keep the exception, as a task queue keeping a failed task's exception does (the traceback holds
the exit's frame, and with it the scope), where ``test_interrupted.py`` gets there by
interrupting every point.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import uuid
from types import FrameType
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import sessionmaker

import outbox
from outbox import NoActiveTransactionError, OutboxProducer
from tests.checker.test_checker import SECRET
from tests.outbox.test_asyncio import async_factory, async_url
from tests.outbox.test_interrupted import Interrupted
from tests.pipeline import Pipeline, pipeline
from tests.producer_fixtures import Topics, order_ids, orders

pytestmark = [pytest.mark.integration, pytest.mark.scale]  # beside test_interrupted.py


def left_and_next(
    running: Pipeline, engine: sa.Engine, topics: Topics, left: str, placed: str
) -> None:
    """The left transaction rolled back, nothing of it anywhere; the next one committed once."""
    txn_of = {h.message.key.decode(): h.txn_id for h in topics.halves() if h.message.key}
    assert running.decided([txn_of[left]]) == {txn_of[left]: "ROLLBACK"}
    assert set(order_ids(engine)) & {left, placed} == {placed}
    delivered = running.settle(lambda: {placed})
    assert delivered[placed] == 1
    assert delivered[left] == 0


SCOPE = os.path.join(os.path.dirname(outbox.__file__), "scope.py")


def interrupt_the_exit() -> None:
    """Raise at the start of the next Python function called, as a signal handler's exception
    does: called last in a ``with`` body, that is the start of the statement's exit."""

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            sys.setprofile(None)
            raise Interrupted(f"{frame.f_code.co_filename}:{frame.f_code.co_qualname}")

    sys.setprofile(profile)


def interrupted_the_exit(err: Interrupted) -> Interrupted:
    """``err``, raised in the scope's exit, whose traceback holds that frame (and the scope)."""
    assert str(err).split(":")[0] == SCOPE, err
    frames = []
    tb = err.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    assert SCOPE in frames, "the traceback holds the exit's frame, and with it the scope"
    return err


HOW = ["scope-dropped", "exception-kept"]


def leave(producer: OutboxProducer, factory: sessionmaker, topic: str, left: str, how: str) -> Any:
    """Leave a ``with`` scope without its exit: dropped once entered directly, or raised out of
    at the start of its exit with the exception kept (returned)."""
    if how == "scope-dropped":
        scope = producer.transaction(factory)
        place(scope.__enter__(), topic, left)
        return None  # the scope goes with this frame: its generator closes now
    try:
        with producer.transaction(factory) as txn:
            place(txn, topic, left)
            interrupt_the_exit()
    except Interrupted as err:
        return interrupted_the_exit(err)
    raise AssertionError("not interrupted")


async def leave_async(
    producer: OutboxProducer, factory: Any, topic: str, left: str, how: str
) -> Any:
    """:func:`leave` for ``async with``: a dropped scope's generator is finalised by the loop."""
    if how == "scope-dropped":
        scope = producer.transaction(factory)
        await place_async(await scope.__aenter__(), topic, left)
        return None
    try:
        async with producer.transaction(factory) as txn:
            await place_async(txn, topic, left)
            interrupt_the_exit()
    except Interrupted as err:
        return interrupted_the_exit(err)
    raise AssertionError("not interrupted")


def place(txn: Any, topic: str, order: str) -> None:
    txn.send(topic, order, key=order)
    txn.session.execute(orders.insert().values(id=order, amount=1))


async def place_async(txn: Any, topic: str, order: str) -> None:
    await txn.send(topic, order, key=order)
    await txn.session.execute(orders.insert().values(id=order, amount=1))


@pytest.mark.parametrize("how", HOW)
def test_a_scope_left_without_its_exit_is_ended_not_joined_by_the_next_transaction(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
    how: str,
) -> None:
    """A kept exception keeps the left scope, its session and its database transaction: the
    next transaction in the thread neither joins it nor waits on its locks (SQLite's write lock,
    a row PostgreSQL holds), and the left one is rolled back there and then."""
    producer.serve_checks(engine=engine, secret=SECRET)
    left, placed = f"left-{uuid.uuid4().hex[:8]}", f"next-{uuid.uuid4().hex[:8]}"
    own = sa.create_engine(db_url)  # its pool shows whether the left session was closed
    factory = sessionmaker(own)
    try:
        with pipeline(kafka_bootstrap, topics) as running:
            kept = leave(producer, factory, running.topic, left, how)
            with pytest.raises(NoActiveTransactionError):
                outbox.send(running.topic, "nowhere")
            with producer.transaction(factory) as txn:
                place(txn, running.topic, placed)
            checked_out = own.pool.checkedout()  # type: ignore[attr-defined]
            left_and_next(running, engine, topics, left, placed)
            del kept  # kept until here
        assert checked_out == 0, "the left session was closed by the next transaction"
    finally:
        own.dispose()


@pytest.mark.parametrize("how", HOW)
def test_an_async_scope_left_without_its_exit_is_ended_not_joined_by_the_next_transaction(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
    how: str,
) -> None:
    """As above, in asyncio: one task, a worker's loop, going straight on. Dropped, the left
    scope's generator is finalised on the loop's next turn, after the next transaction has
    looked for one to join."""
    producer.serve_checks(engine=engine, secret=SECRET)
    left, placed = f"left-{uuid.uuid4().hex[:8]}", f"next-{uuid.uuid4().hex[:8]}"
    loop_errors: list[Any] = []
    refused: list[str] = []
    checked_out: list[int] = []

    async def run(topic: str) -> Any:
        asyncio.get_running_loop().set_exception_handler(
            lambda _, context: loop_errors.append(context.get("exception"))
        )
        own = create_async_engine(async_url(db_url))
        factory = async_sessionmaker(own, expire_on_commit=False)
        try:
            kept = await leave_async(producer, factory, topic, left, how)
            try:
                await outbox.send(topic, "nowhere")
            except NoActiveTransactionError:
                refused.append("nowhere")
            async with producer.transaction(factory) as txn:  # straight on, in the same task
                await place_async(txn, topic, placed)
            await asyncio.sleep(0.1)  # the loop finalises a dropped one
            checked_out.append(own.pool.checkedout())  # type: ignore[attr-defined]
            return kept
        finally:
            await own.dispose()

    with pipeline(kafka_bootstrap, topics) as running:
        kept = asyncio.run(run(running.topic))
        left_and_next(running, engine, topics, left, placed)
        del kept
    assert refused == ["nowhere"], "outbox.send() outside a transaction is refused"
    assert checked_out == [0], "the left session was closed"
    assert loop_errors == [], "the left transaction's cleanup failed unseen"


def test_an_async_scope_still_running_is_joined_by_the_scopes_nested_in_it(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
) -> None:
    """The other side of the check: a statement still in its body holds its scope, so an
    ``async with`` and an ``async def`` decorated call inside it join it, and it commits all."""
    producer.serve_checks(engine=engine, secret=SECRET)
    placed = [f"{part}-{uuid.uuid4().hex[:8]}" for part in ("outer", "nested", "called")]
    txn_ids: list[str] = []

    async def run(topic: str) -> None:
        async with async_factory(db_url) as factory:

            @outbox.transactional(producer=producer, session_factory=factory)
            async def called(order: str, *, session: AsyncSession) -> None:
                txn_ids.append(outbox.current_transaction().txn_id)
                await session.execute(orders.insert().values(id=order, amount=1))
                await outbox.send(topic, order, key=order)

            async with producer.transaction(factory) as outer:
                txn_ids.append(outer.txn_id)
                await outer.send(topic, placed[0], key=placed[0])
                assert outer.session is not None
                await outer.session.execute(orders.insert().values(id=placed[0], amount=1))
                async with producer.transaction(factory) as nested:
                    txn_ids.append(nested.txn_id)
                    await nested.send(topic, placed[1], key=placed[1])
                    assert nested.session is not None
                    await nested.session.execute(orders.insert().values(id=placed[1], amount=1))
                await called(placed[2])

    with pipeline(kafka_bootstrap, topics) as running:
        asyncio.run(run(running.topic))
        assert len(set(txn_ids)) == 1, "one transaction"
        assert running.decided(txn_ids) == {txn_ids[0]: "COMMIT"}
        assert set(order_ids(engine)) >= set(placed)
        delivered = running.settle(lambda: set(placed))
        assert {o: delivered[o] for o in placed} == dict.fromkeys(placed, 1)


def test_a_scope_entered_by_an_async_exit_stack_is_joined_and_commits(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
) -> None:
    """An ``AsyncExitStack`` (FastAPI runs dependencies in one) looks the exits up on the type,
    so no statement token is made: the scope, which the stack holds, stands in for it."""
    producer.serve_checks(engine=engine, secret=SECRET)
    placed = [f"{part}-{uuid.uuid4().hex[:8]}" for part in ("stacked", "nested")]
    txn_ids: list[str] = []

    async def run(topic: str) -> None:
        async with async_factory(db_url) as factory, contextlib.AsyncExitStack() as stack:
            txn = await stack.enter_async_context(producer.transaction(factory))
            txn_ids.append(txn.txn_id)
            await txn.send(topic, placed[0], key=placed[0])
            assert txn.session is not None
            await txn.session.execute(orders.insert().values(id=placed[0], amount=1))
            await asyncio.sleep(0)
            async with producer.transaction(factory) as nested:
                txn_ids.append(nested.txn_id)
                await outbox.send(topic, placed[1], key=placed[1])
                await txn.session.execute(orders.insert().values(id=placed[1], amount=1))

    with pipeline(kafka_bootstrap, topics) as running:
        asyncio.run(run(running.topic))
        assert len(set(txn_ids)) == 1, "one transaction"
        assert running.decided(txn_ids) == {txn_ids[0]: "COMMIT"}
        assert set(order_ids(engine)) >= set(placed)
        delivered = running.settle(lambda: set(placed))
        assert {o: delivered[o] for o in placed} == dict.fromkeys(placed, 1)

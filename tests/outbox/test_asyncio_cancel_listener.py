"""``AsyncTransactionalProducer.send_message_in_transaction`` cancelled while the listener's local
transaction runs.

A synchronous listener runs in a worker thread, which a cancellation cannot stop: the thread goes
on and may still commit after its caller got the ``CancelledError``, with no op written. Until it
ends, a check of its transaction must answer UNKNOWN (not the listener's check, which would find
no row yet and say ROLLBACK for work about to commit); once it has ended, the check decides. A
coroutine listener is cancelled inside its own ``await`` and its database transaction rolls back.
Against a real relay and checker, each case ends with a ``read_committed`` read of the real topic
beside the rows: an order is delivered, once, if and only if its row committed.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import defaultdict
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import sessionmaker

import outbox
from outbox import LocalTransactionState, OutboxProducer
from tests.checker.test_checker import SECRET
from tests.outbox.test_asyncio import async_url
from tests.pipeline import pipeline
from tests.producer_fixtures import Topics, order_ids, orders

pytestmark = pytest.mark.integration

#: How long a local transaction takes once started: past two of the checker's checks (after
#: 1 s, every 1 s), so that checks come while it still runs.
LOCAL_S = 3.0
#: The order of a first transaction, declined at once: the producer then knows its broker.
WARM_UP = "warm-up"


class SlowOrders:
    """A listener whose local transaction takes LOCAL_S, then commits its order's row or
    declines (the order's id says which); its check reads the row. ``asynchronous``: the
    local transaction is a coroutine on an AsyncSession, else a function on a Session."""

    def __init__(self, factory: sessionmaker, async_factory: async_sessionmaker[Any]) -> None:
        self.factory = factory
        self.async_factory = async_factory
        self.checked: list[tuple[str, LocalTransactionState, float]] = []
        #: When each local transaction that ran to its end ended.
        self.ended: dict[str, float] = {}
        #: Set when an order's local transaction has started (the caller is cancelled then).
        self.started: defaultdict[str, threading.Event] = defaultdict(threading.Event)

    def execute_local_transaction(self, msg: outbox.Message, arg: Any) -> LocalTransactionState:
        order_id = _order(msg)
        if order_id == WARM_UP:
            return LocalTransactionState.ROLLBACK
        self.started[order_id].set()
        time.sleep(LOCAL_S)  # in the worker thread, after the caller was cancelled
        try:
            if order_id.startswith("declined-"):
                return LocalTransactionState.ROLLBACK
            with self.factory.begin() as session:
                session.execute(orders.insert().values(id=order_id, amount=1))
            return LocalTransactionState.COMMIT
        finally:
            self.ended[order_id] = time.monotonic()

    def check_local_transaction(self, msg: outbox.MessageView) -> LocalTransactionState:
        order_id = (msg.key or b"").decode()
        with self.factory() as session:
            found = session.scalar(sa.select(orders.c.id).where(orders.c.id == order_id))
        state = LocalTransactionState.COMMIT if found else LocalTransactionState.ROLLBACK
        self.checked.append((order_id, state, time.monotonic()))
        return state


class AsyncSlowOrders(SlowOrders):
    async def execute_local_transaction(  # type: ignore[override]
        self, msg: outbox.Message, arg: Any
    ) -> LocalTransactionState:
        order_id = _order(msg)
        if order_id == WARM_UP:
            return LocalTransactionState.ROLLBACK
        async with self.async_factory() as session, session.begin():
            await session.execute(orders.insert().values(id=order_id, amount=1))
            self.started[order_id].set()
            await asyncio.sleep(LOCAL_S)  # cancelled here: the row rolls back
        return LocalTransactionState.COMMIT


def _order(msg: outbox.Message) -> str:
    return msg.key.decode() if isinstance(msg.key, bytes) else str(msg.key)


@pytest.mark.parametrize("listener_form", ["def", "async def"])
def test_a_cancelled_transactional_producer_ends_with_the_database_and_the_topic_agreeing(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    session_factory: sessionmaker,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
    listener_form: str,
) -> None:
    async_engine = create_async_engine(async_url(db_url))
    make = SlowOrders if listener_form == "def" else AsyncSlowOrders
    listener = make(session_factory, async_sessionmaker(async_engine))
    sender = outbox.AsyncTransactionalProducer(producer, listener)
    producer.serve_checks(secret=SECRET)  # only the listener answers: no evidence resolver
    kinds = ["committing", "declined"] if listener_form == "def" else ["rolled-back"]
    order_of = {kind: f"{kind}-{uuid.uuid4().hex[:8]}" for kind in kinds}
    # a checker that asks often enough to outlast the local transaction's UNKNOWNs
    with pipeline(kafka_bootstrap, topics, check_max=20) as running:
        raised: dict[str, type[BaseException] | None] = {}

        async def main() -> None:
            try:
                sent = await sender.send_message_in_transaction(  # the producer warmed up
                    outbox.Message(running.topic, WARM_UP, key=WARM_UP)
                )
                assert sent.local_transaction_state is LocalTransactionState.ROLLBACK
                for kind, order_id in order_of.items():
                    raised[kind] = None
                    call = asyncio.ensure_future(
                        sender.send_message_in_transaction(
                            outbox.Message(running.topic, order_id, key=order_id)
                        )
                    )
                    # When the caller is cancelled while the local transaction runs
                    await asyncio.to_thread(listener.started[order_id].wait, 30)
                    call.cancel()
                    try:
                        await call
                    except BaseException as err:
                        raised[kind] = type(err)
                # the checks are answered (an async listener's on this loop) while it runs
                halves = await asyncio.to_thread(_halves_of, topics, set(order_of.values()))
                await asyncio.to_thread(running.decided, halves)
            finally:
                await async_engine.dispose()

        asyncio.run(main())
        # Then each caller got its cancellation
        assert raised == dict.fromkeys(kinds, asyncio.CancelledError)
        rows = set(order_ids(engine)) & set(order_of.values())
        expected = {order_of["committing"]} if "committing" in order_of else set()
        assert rows == expected
        # and the listener's check was asked only once a thread's local transaction had ended
        # (before that, its checks were answered UNKNOWN), so what the thread did decided
        assert set(listener.ended) == (set(order_of.values()) if make is SlowOrders else set())
        early = [(o, s) for o, s, at in listener.checked if at < listener.ended.get(o, 0.0)]
        assert early == [], early
        # And an order is delivered, once, if and only if its row committed
        delivered = running.settle(lambda: expected)
        assert set(delivered) & set(order_of.values()) == expected, delivered
        assert all(n == 1 for n in delivered.values()), delivered


def _halves_of(topics: Topics, order_ids_: set[str], timeout: float = 30) -> list[str]:
    """The transaction ids of the orders' half records, once all are on the half topic."""
    deadline = time.monotonic() + timeout
    while True:
        found = {
            h.message.key.decode(): h.txn_id
            for h in topics.halves()
            if h.message.key is not None and h.message.key.decode() in order_ids_
        }
        if set(found) == order_ids_:
            return list(found.values())
        assert time.monotonic() < deadline, f"half records missing: {order_ids_ - set(found)}"
        time.sleep(0.2)


def test_a_listener_thread_outliving_its_event_loop_keeps_its_checks_unknown(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    session_factory: sessionmaker,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
) -> None:
    """``asyncio.run`` returning with the call still running cancels every task left, the
    worker thread's own task among them. Before, that let go of the transaction's mark while
    the thread still ran: a check meanwhile asked the listener, found no row, answered
    ROLLBACK, and the row the thread then committed never got its message."""
    async_engine = create_async_engine(async_url(db_url))
    listener = SlowOrders(session_factory, async_sessionmaker(async_engine))
    sender = outbox.AsyncTransactionalProducer(producer, listener)
    producer.serve_checks(secret=SECRET)
    order_id = f"committing-{uuid.uuid4().hex[:8]}"
    left: list[asyncio.Future[Any]] = []
    with pipeline(kafka_bootstrap, topics, check_max=20) as running:

        async def main() -> None:
            try:
                await sender.send_message_in_transaction(
                    outbox.Message(running.topic, WARM_UP, key=WARM_UP)
                )
                left.append(
                    asyncio.ensure_future(
                        sender.send_message_in_transaction(
                            outbox.Message(running.topic, order_id, key=order_id)
                        )
                    )
                )
                await asyncio.to_thread(listener.started[order_id].wait, 30)
                # When the application's main coroutine returns with the call still running
            finally:
                await async_engine.dispose()

        asyncio.run(main())  # cancels the call; waits for the executor's thread to end
        assert [call.cancelled() for call in left] == [True]
        [txn_id] = _halves_of(topics, {order_id})
        assert running.decided([txn_id]) == {txn_id: "COMMIT"}
        # Then the thread committed its row, and no check reached the listener before that
        assert order_id in order_ids(engine)
        early = [(o, s) for o, s, at in listener.checked if at < listener.ended[order_id]]
        assert early == [], early
        assert running.settle(lambda: {order_id}) == {order_id: 1}

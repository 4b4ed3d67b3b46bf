"""The asyncio forms: ``@outbox.transactional`` on ``async def`` and ``async with
producer.transaction(AsyncSession)``, on SQLAlchemy's AsyncSession (aiosqlite, psycopg's async
mode), against a real broker, relay and checker.

Each scenario ends where a user looks: the order rows in the database and what a
``read_committed`` consumer of the real topic receives, which must agree (both or neither),
with the op records lost so the checker has to decide from the evidence row the asyncio form
wrote. The event loop is never blocked: a ticker keeps turning while sends wait on a stopped
broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import sessionmaker

import outbox
from outbox import (
    AsyncOutboxTransaction,
    HalfSendError,
    OutboxProducer,
    OutboxSettings,
    SendNotAwaitedError,
    SendRolledBackError,
    WrongFormError,
    ensure_topics,
)
from outbox.testing import RunningService
from tests.checker.test_checker import SECRET
from tests.kafka_helpers import set_topic_config
from tests.pipeline import ops_lost, pipeline
from tests.producer_fixtures import Topics, evidence_ids, order_ids, orders

pytestmark = pytest.mark.integration


def async_url(db_url: str) -> str:
    """The same database through an asyncio driver."""
    if db_url.startswith("sqlite:///"):
        return db_url.replace("sqlite:///", "sqlite+aiosqlite:///", 1)
    return db_url  # postgresql+psycopg: psycopg 3 serves SQLAlchemy's asyncio engine too


@asynccontextmanager
async def async_factory(db_url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    engine = create_async_engine(async_url(db_url))
    try:
        yield async_sessionmaker(engine, expire_on_commit=False)
    finally:
        await engine.dispose()


class Declined(Exception):
    pass


async def _insert(session: AsyncSession, order_id: str) -> None:
    await session.execute(orders.insert().values(id=order_id, amount=1))


def test_async_def_and_async_with_end_with_rows_and_messages_agreeing(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    producer.serve_checks(engine=engine, secret=SECRET)
    with pipeline(kafka_bootstrap, topics) as running:
        topic = running.topic
        expected: set[str] = set()
        refused: set[str] = set()
        txn_ids: list[str] = []
        raised: dict[str, type[BaseException]] = {}

        async def scenarios(factory: async_sessionmaker[AsyncSession]) -> None:
            @outbox.transactional(producer=producer, session_factory=factory)
            async def place(order_id: str, session: AsyncSession = outbox.INJECTED) -> str:
                await _insert(session, order_id)
                await outbox.send(topic, order_id, key=order_id)
                await asyncio.sleep(0)  # other tasks run inside the transaction
                return outbox.current_transaction().txn_id

            @outbox.transactional(producer=producer, session_factory=factory)
            async def place_then_decline(order_id: str, *, session: AsyncSession) -> None:
                txn_ids.append(outbox.current_transaction().txn_id)
                await _insert(session, order_id)
                await outbox.send_batch([outbox.Message(topic, order_id, key=order_id)])
                raise Declined(order_id)

            @outbox.transactional(producer=producer, session_factory=factory)
            async def place_unawaited(order_id: str, *, session: AsyncSession) -> None:
                txn_ids.append(outbox.current_transaction().txn_id)
                await _insert(session, order_id)
                outbox.send(topic, order_id, key=order_id)  # no await: never sent

            @outbox.transactional(producer=producer, session_factory=factory)
            async def place_then_roll_back(order_id: str, *, session: AsyncSession) -> None:
                txn_ids.append(outbox.current_transaction().txn_id)
                await outbox.send(topic, order_id, key=order_id)
                await _insert(session, order_id)
                await session.rollback()  # undoes the evidence row written with the send
                await _insert(session, order_id + "-after")

            async def txn_send_unawaited(order_id: str) -> None:
                async with producer.transaction(factory) as txn:
                    txn_ids.append(txn.txn_id)
                    assert txn.session is not None
                    await _insert(txn.session, order_id)
                    txn.send(topic, order_id, key=order_id)  # no await: never sent

            async def in_context(order_id: str) -> None:
                async with producer.transaction(factory) as txn:
                    txn_ids.append(txn.txn_id)
                    assert txn.session is not None
                    await _insert(txn.session, order_id)
                    await txn.send(topic, order_id, key=order_id)

            # Given concurrent transactions in each form, their ops lost
            ok = [f"async-{uuid.uuid4().hex[:8]}" for _ in range(20)]
            with_block = [f"async-with-{uuid.uuid4().hex[:8]}" for _ in range(5)]
            results = await asyncio.gather(
                *(place(o) for o in ok), *(in_context(o) for o in with_block)
            )
            txn_ids.extend(r for r in results if r)
            expected.update(ok, with_block)
            for name, body in {
                "declined": place_then_decline,
                "unawaited": place_unawaited,
                "txn.send unawaited": txn_send_unawaited,
                "rolled-back": place_then_roll_back,
            }.items():
                order_id = f"{name}-{uuid.uuid4().hex[:8]}"
                refused.update({order_id, order_id + "-after"})
                try:
                    await body(order_id)
                except Exception as err:
                    raised[name] = type(err)

        async def main() -> None:
            async with async_factory(db_url) as factory:
                await scenarios(factory)

        with ops_lost(producer, monkeypatch):
            asyncio.run(main())
        # Then each refusal said why with its own error
        assert raised == {
            "declined": Declined,
            "unawaited": SendNotAwaitedError,
            "txn.send unawaited": SendNotAwaitedError,
            "rolled-back": SendRolledBackError,
        }
        sent = {h.txn_id for h in topics.halves()}
        decided = running.decided(set(txn_ids) & sent)
        assert set(decided.values()) <= {"COMMIT", "ROLLBACK"}
        # and the database and the topic agree: the committed ones once each, no refused one
        rows = set(order_ids(engine))
        assert expected <= rows
        assert not refused & rows
        delivered = running.settle(lambda: expected)
        assert not refused & set(delivered)
        assert all(n == 1 for n in delivered.values()), delivered
        assert set(delivered) == expected
        # and every committed one left its evidence row, which the checker decided from
        evidence = evidence_ids(engine)
        assert all(evidence.get(t) == "evidence" for t, s in decided.items() if s == "COMMIT")


def test_each_form_given_the_other_forms_session_fails_at_once_naming_the_right_form(
    producer: OutboxProducer, engine: sa.Engine, db_url: str, topics: Topics
) -> None:
    factory = sessionmaker(engine)
    rows_before = order_ids(engine)

    # a synchronous session in `async with`, an AsyncSession in `with`
    async def mixed() -> None:
        with pytest.raises(WrongFormError, match=r"`with producer\.transaction"):
            async with producer.transaction(factory):
                pass
        async with async_factory(db_url) as afactory:
            refused = pytest.raises(WrongFormError, match=r"async with producer\.transaction")
            with refused, producer.transaction(afactory):
                pass
            async with afactory() as asession:
                with (
                    pytest.raises(WrongFormError, match="async with"),
                    producer.transaction(asession),
                ):
                    pass

            # an async def with a synchronous factory, a def with an asyncio one
            @outbox.transactional(producer=producer, session_factory=factory)
            async def wrong_async(*, session: Any) -> None:
                raise AssertionError("never runs")

            with pytest.raises(WrongFormError, match="AsyncSession or async_sessionmaker"):
                await wrong_async()

            @outbox.transactional(producer=producer, session_factory=afactory)
            def wrong_sync(*, session: Any) -> None:
                raise AssertionError("never runs")

            with pytest.raises(WrongFormError, match="async def"):
                wrong_sync()

            # and a synchronous transaction cannot be joined from an asyncio one
            nested = pytest.raises(WrongFormError, match=r"^an asyncio .* nest transactions of one")
            with producer.transaction(factory), nested:
                async with producer.transaction(afactory):
                    pass

            # nor the other way round: a synchronous service run with asyncio.to_thread, which
            # copies the task's context (the asyncio transaction) into its thread
            @outbox.transactional(producer=producer, session_factory=factory)
            def sync_service(*, session: Any) -> None:
                raise AssertionError("never runs")

            nested = pytest.raises(WrongFormError, match=r"^a synchronous .* nest transactions of")
            with nested:
                async with producer.transaction(afactory):
                    await asyncio.to_thread(sync_service)

            # and outbox.send() in such a thread (or a plain def endpoint under an async
            # dependency) is refused at the send: nothing there could await it
            in_a_thread = pytest.raises(WrongFormError, match=r"no running event loop.*await")
            with in_a_thread:
                async with producer.transaction(afactory):
                    await asyncio.to_thread(outbox.send, "orders", b"never sent")
            with pytest.raises(WrongFormError, match=r"^txn\.send\(\) .*`await txn\.send\("):
                async with producer.transaction(afactory) as txn:
                    await asyncio.to_thread(txn.send, "orders", b"never sent")

    asyncio.run(mixed())
    assert topics.halves() == []  # nothing was sent by any of them
    assert order_ids(engine) == rows_before


@pytest.mark.processes
def test_the_event_loop_keeps_turning_while_sends_wait_on_a_stopped_broker(
    doomed_kafka: RunningService, sqlite_url: str
) -> None:
    """A ticker coroutine runs beside asyncio transactions whose half sends get no answer (the
    broker is stopped): no tick is late by more than 50 ms, and no transaction commits."""
    settings = OutboxSettings(
        bootstrap_servers=doomed_kafka.address,
        producer_group="orders",
        topic_prefix=f"__outbox-loop-{uuid.uuid4().hex[:8]}",
        partitions=2,
        send_timeout_s=2,
        send_attempts=2,
    )
    ensure_topics(settings)
    engine = sa.create_engine(sqlite_url)
    outbox.migrations.upgrade(sqlite_url)
    orders.metadata.create_all(engine)
    late: list[float] = []
    outcomes: list[BaseException | None] = []
    ids = [f"loop-{uuid.uuid4().hex[:8]}" for _ in range(10)]

    async def ticker(stop: asyncio.Event, every_s: float = 0.01) -> None:
        while not stop.is_set():
            before = time.monotonic()
            await asyncio.sleep(every_s)
            late.append(time.monotonic() - before - every_s)

    async def main(producer: OutboxProducer) -> None:
        async with async_factory(sqlite_url) as factory:

            @outbox.transactional(producer=producer, session_factory=factory)
            async def place(order_id: str, *, session: AsyncSession) -> None:
                # (the send first: ten SQLite writers at once would wait for its write lock)
                await outbox.send("orders", order_id, key=order_id)
                await _insert(session, order_id)

            async def attempt(order_id: str) -> None:
                try:
                    await place(order_id)
                    outcomes.append(None)
                except HalfSendError as err:
                    outcomes.append(err)

            stop = asyncio.Event()
            ticking = asyncio.create_task(ticker(stop))
            await asyncio.gather(*(attempt(order_id) for order_id in ids))
            stop.set()
            await ticking

    with OutboxProducer(settings) as producer:
        assert producer.partitions == 2  # known before the broker goes away
        doomed_kafka.stop()
        started = time.monotonic()
        asyncio.run(main(producer))
        waited = time.monotonic() - started
    # The sends waited for their acknowledgements (two attempts each) ...
    assert waited > settings.send_timeout_s
    assert len(outcomes) == 10 and all(isinstance(o, HalfSendError) for o in outcomes)
    # ... while the loop kept turning
    assert len(late) > 100
    assert max(late) < 0.05, f"the loop was blocked for {max(late) * 1000:.0f} ms"
    assert not set(ids) & set(order_ids(engine))
    engine.dispose()


class AsyncOrders:
    """An asyncio listener: its local transaction and its check both on an AsyncSession."""

    def __init__(self, factory: async_sessionmaker[AsyncSession], answers: dict[str, str]) -> None:
        self.factory = factory
        self.answers = answers  # order id -> what execute_local_transaction does
        self.checked: list[str] = []

    async def execute_local_transaction(self, msg: outbox.Message, arg: Any) -> Any:
        order_id = msg.key.decode() if isinstance(msg.key, bytes) else str(msg.key)
        answer = self.answers[order_id]
        if answer == "ROLLBACK":
            return outbox.LocalTransactionState.ROLLBACK
        async with self.factory() as session, session.begin():
            await _insert(session, order_id)
        if answer == "raise":
            raise Declined(order_id)
        if answer == "wrong type":
            return "COMMIT"
        return outbox.LocalTransactionState[answer]

    async def check_local_transaction(self, msg: outbox.MessageView) -> Any:
        order_id = (msg.key or b"").decode()
        self.checked.append(order_id)
        async with self.factory() as session:
            found = await session.scalar(sa.select(orders.c.id).where(orders.c.id == order_id))
        state = outbox.LocalTransactionState
        return state.COMMIT if found else state.ROLLBACK


def test_the_asyncio_transactional_producer_is_resolved_by_its_async_check(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answers = {
        f"{kind}-{uuid.uuid4().hex[:8]}": kind
        for kind in ("COMMIT", "ROLLBACK", "UNKNOWN", "raise", "wrong type")
    }
    committed = {o for o, kind in answers.items() if kind != "ROLLBACK"}
    async_engine = create_async_engine(async_url(db_url))
    listener = AsyncOrders(async_sessionmaker(async_engine), answers)
    sender = outbox.AsyncTransactionalProducer(producer, listener)
    producer.serve_checks(secret=SECRET)  # only the listener answers: no evidence resolver
    with pipeline(kafka_bootstrap, topics) as running:

        async def main() -> list[str]:
            try:
                results = [
                    await sender.send_message_in_transaction(
                        outbox.Message(running.topic, order_id, key=order_id)
                    )
                    for order_id in answers
                ]
                txn_ids = [r.transaction_id for r in results]
                # the checks are answered on this loop while it runs
                await asyncio.to_thread(running.decided, txn_ids)
                assert set(listener.checked) == set(answers), listener.checked
                return txn_ids
            finally:
                await async_engine.dispose()

        with ops_lost(producer, monkeypatch):
            txn_ids = asyncio.run(main())
        decided = running.decided(txn_ids)
        assert sorted(decided.values()) == ["COMMIT"] * 4 + ["ROLLBACK"]
        assert committed == set(order_ids(engine)) & set(answers)
        delivered = running.settle(lambda: committed)
        assert delivered == dict.fromkeys(committed, 1)


def test_a_failed_send_the_code_caught_or_a_send_left_running_never_splits_the_transaction(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    outbox_settings: OutboxSettings,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Four ways asyncio lets code go on past a send (found in review, failing before):
    a send Kafka refused whose error the code caught (beside another send of a gather), a
    send started as a task and never awaited, two sends started as tasks, the second
    waiting for the first when the block ended, and a send cancelled while it waited for another
    (a timeout's cancellation the code caught). The first must refuse the commit (no row,
    nothing delivered); the second must be waited for, so its evidence row is in the commit and
    the checker answers COMMIT for it (before: committed without the row, fenced, ROLLBACK); the
    third must refuse it too, its second send refused as late (before: committed without that
    message); the fourth too, as a send that failed (before: committed without that message)."""
    # the half topic takes records of 2 KB at most; the producer's own check allows 1 MiB
    set_topic_config(kafka_bootstrap, outbox_settings.topics.half, "max.message.bytes", "2048")
    producer.serve_checks(engine=engine, secret=SECRET)
    with pipeline(kafka_bootstrap, topics) as running:
        topic = running.topic
        caught, left_running, queued, cancelled = (
            f"{n}-{uuid.uuid4().hex[:8]}" for n in ("caught", "running", "queued", "cancelled")
        )
        txn_ids: list[str] = []
        raised: list[type[BaseException]] = []
        tasks: list[asyncio.Future[Any]] = []

        async def main() -> None:
            async with async_factory(db_url) as factory:

                @outbox.transactional(producer=producer, session_factory=factory)
                async def swallow(*, session: AsyncSession) -> None:
                    txn_ids.append(outbox.current_transaction().txn_id)
                    with contextlib.suppress(HalfSendError):  # the code goes on regardless
                        await asyncio.gather(
                            outbox.send(topic, caught, key=caught),
                            outbox.send(topic, "x" * 5000, key=caught),  # refused by Kafka
                        )
                    await _insert(session, caught)

                @outbox.transactional(producer=producer, session_factory=factory)
                async def fire_and_forget(*, session: AsyncSession) -> None:
                    txn_ids.append(outbox.current_transaction().txn_id)
                    await _insert(session, left_running)
                    tasks.append(
                        asyncio.ensure_future(outbox.send(topic, left_running, key=left_running))
                    )
                    await asyncio.sleep(0)  # the send starts, the block ends before its ack

                @outbox.transactional(producer=producer, session_factory=factory)
                async def two_left_running(*, session: AsyncSession) -> None:
                    txn = outbox.current_transaction()
                    assert isinstance(txn, AsyncOutboxTransaction)
                    txn_ids.append(txn.txn_id)
                    await _insert(session, queued)
                    for value in (queued, f"{queued}-second"):
                        tasks.append(asyncio.create_task(txn.send(topic, value, key=queued)))
                    await asyncio.sleep(0)  # the first sends, the second waits for it to end

                @outbox.transactional(producer=producer, session_factory=factory)
                async def one_cancelled(*, session: AsyncSession) -> None:
                    txn = outbox.current_transaction()
                    assert isinstance(txn, AsyncOutboxTransaction)
                    txn_ids.append(txn.txn_id)
                    await _insert(session, cancelled)
                    first = asyncio.create_task(txn.send(topic, cancelled, key=cancelled))
                    second = asyncio.create_task(txn.send(topic, f"{cancelled}-2", key=cancelled))
                    await asyncio.sleep(0)  # the first sends, the second waits for it to end
                    second.cancel()  # what a timeout does; the code catches it and goes on
                    with contextlib.suppress(asyncio.CancelledError):
                        await second
                    await first

                try:
                    await swallow()
                except HalfSendError as err:
                    raised.append(type(err))
                    assert "cannot commit" in str(err)
                await fire_and_forget()
                try:
                    await two_left_running()
                except HalfSendError as err:
                    raised.append(type(err))
                    assert "is ending" in str(err)
                try:
                    await one_cancelled()
                except HalfSendError as err:
                    raised.append(type(err))
                    assert "cannot commit" in str(err) and "none of them was sent" in str(err)
                await asyncio.gather(*tasks, return_exceptions=True)

        with ops_lost(producer, monkeypatch):
            asyncio.run(main())
        assert raised == [HalfSendError, HalfSendError, HalfSendError]
        decided = running.decided([t for t in txn_ids if t in {h.txn_id for h in topics.halves()}])
        rows = set(order_ids(engine))
        assert caught not in rows and left_running in rows and queued not in rows
        assert cancelled not in rows
        assert decided[txn_ids[1]] == "COMMIT"  # from the evidence row the commit carried
        assert decided[txn_ids[2]] == "ROLLBACK"  # a send queued behind the block's end
        assert decided[txn_ids[3]] == "ROLLBACK"  # a send cancelled while it waited
        delivered = running.settle(lambda: {left_running})
        assert delivered[left_running] == 1 and caught not in delivered
        assert not {queued, f"{queued}-second", cancelled, f"{cancelled}-2"} & set(delivered)


def test_a_scope_is_entered_once_and_a_task_outliving_its_transaction_joins_none(
    producer: OutboxProducer, engine: sa.Engine, db_url: str
) -> None:
    scope = producer.transaction(sessionmaker(engine))
    with scope, pytest.raises(outbox.ConfigurationError, match="entered once"), scope:
        pass

    async def main() -> str:
        async with async_factory(db_url) as factory:
            leftover: list[asyncio.Task[str]] = []

            async def later() -> str:
                await asyncio.sleep(0.05)  # runs after the transaction that started it ended
                async with producer.transaction(factory) as txn:
                    return txn.txn_id

            async with producer.transaction(factory) as outer:
                leftover.append(asyncio.create_task(later()))
            inner = await leftover[0]
            assert inner != outer.txn_id  # a transaction of its own, not the ended one
            return inner

    asyncio.run(main())

"""A flush the outbox's own COMMIT starts with fails: the transaction rolls back on the spot.

``session.commit()`` flushes the ORM's pending objects before it asks the database to COMMIT,
so the commonest failure a user meets there - an ``IntegrityError`` from an object added after
the last query (a NOT NULL or unique column, a foreign key) - comes before any COMMIT was
sent, and SQLAlchemy has already rolled the database transaction back. The outcome is known:
ROLLBACK. Each form writes that ROLLBACK op itself (``decided_by`` the producer) as it raises
the user's error, instead of leaving the half messages to wait for a check; the rows and the
real topic (a ``read_committed`` read, a relay and a checker running) hold neither the order nor
its message, and the next transaction on the same engine commits and is delivered once.
Where the work may have committed, the outcome stays UNKNOWN and the checker decides: a COMMIT
the database itself refuses (``tests/checker/test_failures.py``, the deferred constraint), and
here a savepoint an application's listener rolled back before a COMMIT whose answer was lost,
and a listener that committed through the session's connection before the flush failed.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session, registry, sessionmaker

import outbox
from outbox import OutboxProducer
from outbox.protocol.states import TERMINAL_STATES
from tests.checker.test_checker import SECRET
from tests.outbox.test_asyncio import async_factory
from tests.pipeline import Pipeline, pipeline
from tests.producer_fixtures import Topics, evidence_ids, order_ids, orders

pytestmark = pytest.mark.integration


class Order:
    """An order as the ORM's users write one: added to the session, flushed by the COMMIT."""

    def __init__(self, id: str, amount: int | None) -> None:
        self.id, self.amount = id, amount


registry().map_imperatively(Order, orders)


def _refused_at_flush(session: Session, ids: list[str]) -> None:
    """What each form runs after its send: a row written now, and a pending order whose
    INSERT (``amount`` is NOT NULL) only the COMMIT's flush sends."""
    session.execute(orders.insert().values(id=ids[0], amount=1))
    session.add(Order(ids[1], None))


def decorated(producer: OutboxProducer, factory: sessionmaker, topic: str, ids: list[str]) -> str:
    txn_ids: list[str] = []

    @outbox.transactional(producer=producer, session_factory=factory)
    def place(*, session: Session) -> None:
        txn_ids.append(outbox.current_transaction().txn_id)
        outbox.send(topic, ids[0], key=ids[0])
        _refused_at_flush(session, ids)

    with pytest.raises(sa.exc.IntegrityError):
        place()
    return txn_ids[0]


def in_context(producer: OutboxProducer, factory: sessionmaker, topic: str, ids: list[str]) -> str:
    with pytest.raises(sa.exc.IntegrityError), producer.transaction(factory) as txn:
        txn.send(topic, ids[0], key=ids[0])
        assert isinstance(txn.session, Session)
        _refused_at_flush(txn.session, ids)
    return txn.txn_id


async def _refused_at_flush_async(session: AsyncSession, ids: list[str]) -> None:
    await session.execute(orders.insert().values(id=ids[0], amount=1))
    session.add(Order(ids[1], None))


async def decorated_async(producer: OutboxProducer, factory: Any, topic: str, ids: list) -> str:
    txn_ids: list[str] = []

    @outbox.transactional(producer=producer, session_factory=factory)
    async def place(*, session: AsyncSession) -> None:
        txn_ids.append(outbox.current_transaction().txn_id)
        await outbox.send(topic, ids[0], key=ids[0])
        await _refused_at_flush_async(session, ids)

    with pytest.raises(sa.exc.IntegrityError):
        await place()
    return txn_ids[0]


async def in_context_async(producer: OutboxProducer, factory: Any, topic: str, ids: list) -> str:
    with pytest.raises(sa.exc.IntegrityError):
        async with producer.transaction(factory) as txn:
            await txn.send(topic, ids[0], key=ids[0])
            assert isinstance(txn.session, AsyncSession)
            await _refused_at_flush_async(txn.session, ids)
    return txn.txn_id


def _then_a_clean_one(producer: OutboxProducer, factory: sessionmaker, topic: str) -> str:
    order = f"after-{uuid.uuid4().hex[:8]}"
    with producer.transaction(factory) as txn:
        txn.send(topic, order, key=order)
        assert isinstance(txn.session, Session)
        txn.session.execute(orders.insert().values(id=order, amount=1))
    return order


async def _then_a_clean_one_async(producer: OutboxProducer, factory: Any, topic: str) -> str:
    order = f"after-{uuid.uuid4().hex[:8]}"
    async with producer.transaction(factory) as txn:
        await txn.send(topic, order, key=order)
        assert isinstance(txn.session, AsyncSession)
        await txn.session.execute(orders.insert().values(id=order, amount=1))
    return order


def _first_decisions(topics: Topics, txn_ids: list[str]) -> dict[str, tuple[str, str]]:
    """Each transaction's first terminal op, as (state, who wrote it)."""
    first: dict[str, tuple[str, str]] = {}
    for op in topics.ops():
        if op.txn_id in txn_ids and op.state in TERMINAL_STATES:
            first.setdefault(op.txn_id, (op.state.value, op.decided_by.value))
    return first


def _judge(running: Pipeline, engine: sa.Engine, txn_id: str, ids: list[str], after: str) -> None:
    # The ROLLBACK is the producer's, written before the call returned: a check would come
    # at the earliest a second later (the checker's timeout here) and be the checker's
    assert _first_decisions(running.topics, [txn_id]) == {txn_id: ("ROLLBACK", "producer")}
    assert not set(ids) & set(order_ids(engine))
    assert txn_id not in evidence_ids(engine)
    assert after in order_ids(engine)
    delivered = running.settle(lambda: {after})
    assert {o: delivered[o] for o in [*ids, after]} == {ids[0]: 0, ids[1]: 0, after: 1}


SYNC: dict[str, Callable[..., str]] = {"decorator": decorated, "with": in_context}
ASYNC: dict[str, Callable[..., Awaitable[str]]] = {
    "async decorator": decorated_async,
    "async with": in_context_async,
}


@pytest.mark.parametrize("form", sorted(SYNC))
def test_a_flush_refused_in_the_commit_writes_the_rollback_at_once(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    session_factory: sessionmaker,
    engine: sa.Engine,
    topics: Topics,
    form: str,
) -> None:
    producer.serve_checks(engine=engine, secret=SECRET)
    with pipeline(kafka_bootstrap, topics) as running:
        ids = [f"flush-{uuid.uuid4().hex[:8]}" for _ in range(2)]
        txn_id = SYNC[form](producer, session_factory, running.topic, ids)
        after = _then_a_clean_one(producer, session_factory, running.topic)
        _judge(running, engine, txn_id, ids, after)


@pytest.mark.parametrize("form", sorted(ASYNC))
def test_a_flush_refused_in_the_async_commit_writes_the_rollback_at_once(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
    form: str,
) -> None:
    producer.serve_checks(engine=engine, secret=SECRET)
    with pipeline(kafka_bootstrap, topics) as running:
        ids = [f"flush-{uuid.uuid4().hex[:8]}" for _ in range(2)]

        async def main() -> tuple[str, str]:
            async with async_factory(db_url) as factory:
                txn_id = await ASYNC[form](producer, factory, running.topic, ids)
                return txn_id, await _then_a_clean_one_async(producer, factory, running.topic)

        txn_id, after = asyncio.run(main())
        _judge(running, engine, txn_id, ids, after)


class Declined(Exception):
    pass


def test_a_before_commit_listener_raising_rolls_back_at_once(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    session_factory: sessionmaker,
    engine: sa.Engine,
    topics: Topics,
) -> None:
    """A ``before_commit`` listener of the application's (a validation, an audit) refusing
    the commit: it runs before the flush, the database transaction is still active, nothing
    committed - the same at-once ROLLBACK."""
    producer.serve_checks(engine=engine, secret=SECRET)

    def refuse(session: Session) -> None:
        raise Declined("the application's own check said no")

    with pipeline(kafka_bootstrap, topics) as running:
        ids = [f"listener-{uuid.uuid4().hex[:8]}" for _ in range(2)]
        with pytest.raises(Declined), producer.transaction(session_factory) as txn:
            txn.send(running.topic, ids[0], key=ids[0])
            assert isinstance(txn.session, Session)
            txn.session.execute(orders.insert().values(id=ids[0], amount=1))
            txn.session.add(Order(ids[1], 1))
            sa.event.listen(txn.session, "before_commit", refuse)
        after = _then_a_clean_one(producer, session_factory, running.topic)
        _judge(running, engine, txn.txn_id, ids, after)


class LostAck(Exception):
    pass


def _savepoint_rolled_back_and_caught(session: Session) -> None:
    try:
        with session.begin_nested():
            raise Declined("a savepoint of the application's, rolled back and caught")
    except Declined:
        pass


def _lose_the_ack(session: Session) -> None:
    raise LostAck("the connection went after the COMMIT")


def _committed_through_the_connection(session: Session) -> None:
    session.connection().commit()


def _refuse_insert(*args: object) -> None:
    raise Declined("a mapper event of the application's, before the INSERT")


#: Listeners of the application's on the transaction's session, run inside the outbox's own
#: ``commit()``, that leave its outcome UNKNOWN though part of them rolled back: the work
#: before them committed.
COMMITTED_ALL_THE_SAME: dict[str, tuple[dict[str, Callable[..., None]], int | None, type]] = {
    # a savepoint's rollback is not the transaction's; the COMMIT then happened
    "savepoint rolled back, then the ack lost": (
        {"before_commit": _savepoint_rolled_back_and_caught, "after_commit": _lose_the_ack},
        1,
        LostAck,
    ),
    # committed under the session, then its flush failed (and SQLAlchemy rolled back)
    "committed through the connection, then the flush refused": (
        {"before_commit": _committed_through_the_connection},
        None,
        sa.exc.IntegrityError,
    ),
    # the same, the flush failing before it sent a statement (which would have begun a
    # database transaction of its own on the connection): seen as the flush began
    "committed through the connection, then the flush failed before its first statement": (
        {"before_commit": _committed_through_the_connection, "before_insert": _refuse_insert},
        1,
        Declined,
    ),
}


@pytest.mark.parametrize("case", sorted(COMMITTED_ALL_THE_SAME))
def test_a_commit_that_may_have_happened_is_left_to_the_checker(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    session_factory: sessionmaker,
    engine: sa.Engine,
    topics: Topics,
    case: str,
) -> None:
    """The other side of the rule: where the transaction's work did commit, the producer
    writes no op, and the checker's COMMIT (the evidence row committed with the work) delivers
    the message once. A ROLLBACK op here would lose it."""
    listeners, amount, raised = COMMITTED_ALL_THE_SAME[case]
    producer.serve_checks(engine=engine, secret=SECRET)
    with pipeline(kafka_bootstrap, topics) as running:
        ids = [f"maybe-{uuid.uuid4().hex[:8]}" for _ in range(2)]
        try:
            with pytest.raises(raised), producer.transaction(session_factory) as txn:
                txn.send(running.topic, ids[0], key=ids[0])
                assert isinstance(txn.session, Session)
                txn.session.execute(orders.insert().values(id=ids[0], amount=1))
                txn.session.add(Order(ids[1], amount))
                for name, listener in listeners.items():
                    target = Order if name == "before_insert" else txn.session
                    sa.event.listen(target, name, listener)
        finally:  # the mapper's listener would see every later flush of an Order too
            if "before_insert" in listeners:
                sa.event.remove(Order, "before_insert", listeners["before_insert"])
        assert ids[0] in order_ids(engine)
        assert running.decided([txn.txn_id]) == {txn.txn_id: "COMMIT"}
        assert _first_decisions(running.topics, [txn.txn_id])[txn.txn_id][1] == "checker"
        delivered = running.settle(lambda: {ids[0]})
        assert delivered[ids[0]] == 1


def test_a_before_commit_listener_raising_rolls_back_at_once_in_asyncio(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
) -> None:
    """The same through an ``AsyncSession``, whose commit runs the sync session's listeners."""
    producer.serve_checks(engine=engine, secret=SECRET)

    def refuse(session: Session) -> None:
        raise Declined("the application's own check said no")

    with pipeline(kafka_bootstrap, topics) as running:
        ids = [f"listener-{uuid.uuid4().hex[:8]}" for _ in range(2)]

        async def main() -> tuple[str, str]:
            async with async_factory(db_url) as factory:
                with pytest.raises(Declined):
                    async with producer.transaction(factory) as txn:
                        await txn.send(running.topic, ids[0], key=ids[0])
                        assert isinstance(txn.session, AsyncSession)
                        await txn.session.execute(orders.insert().values(id=ids[0], amount=1))
                        txn.session.add(Order(ids[1], 1))
                        sa.event.listen(txn.session.sync_session, "before_commit", refuse)
                return txn.txn_id, await _then_a_clean_one_async(producer, factory, running.topic)

        txn_id, after = asyncio.run(main())
        _judge(running, engine, txn_id, ids, after)

"""Sessions made with ``autobegin=False`` (SQLAlchemy 2's explicit-transaction style): the outbox
transaction is their database transaction, so the outbox begins it.

Before, every such transaction failed at its first statement, the caller's or the evidence
row's ("Autobegin is disabled on this Session"), and a factory's caller had no place to call
``session.begin()``. Each form ends with the rows in the database and what a ``read_committed``
consumer reads from the real topic agreeing, one message per committed row.
"""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker

import outbox
from outbox import OutboxProducer
from tests.checker.test_checker import SECRET
from tests.kafka_helpers import unique
from tests.outbox.test_asyncio import async_url
from tests.pipeline import pipeline
from tests.producer_fixtures import Topics, order_ids, orders

pytestmark = pytest.mark.integration


class Declined(Exception):
    pass


def test_sessions_without_autobegin_commit_rows_and_messages_together(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
) -> None:
    producer.serve_checks(engine=engine, secret=SECRET)
    explicit = sessionmaker(engine, autobegin=False)
    committed: list[str] = []
    declined: list[str] = []

    with pipeline(kafka_bootstrap, topics) as running:
        topic = running.topic

        @outbox.transactional(producer=producer, session_factory=explicit)
        def place(order_id: str, *, session: Session, decline: bool = False) -> None:
            outbox.send(topic, order_id, key=order_id)  # the evidence row is the first statement
            session.execute(orders.insert().values(id=order_id, amount=1))
            if decline:
                raise Declined(order_id)

        committed.append(unique("with"))
        with producer.transaction(explicit) as txn:
            assert txn.session is not None
            txn.session.execute(orders.insert().values(id=committed[-1], amount=1))
            txn.send(topic, committed[-1], key=committed[-1])
        committed.append(unique("decorated"))
        place(committed[-1])
        declined.append(unique("declined"))
        with pytest.raises(Declined):
            place(declined[-1], decline=True)
        # a session of the caller's, given and not begun
        committed.append(unique("given"))
        with explicit() as mine:
            place(committed[-1], session=mine)
            assert not mine.in_transaction()  # committed: the outbox ended what it began

        async def in_asyncio() -> None:
            async_engine = create_async_engine(async_url(db_url))
            factory = async_sessionmaker(async_engine, autobegin=False)

            @outbox.transactional(producer=producer, session_factory=factory)
            async def place_async(order_id: str, *, session: AsyncSession) -> None:
                await outbox.send(topic, order_id, key=order_id)
                await session.execute(orders.insert().values(id=order_id, amount=1))

            try:
                committed.append(unique("async-with"))
                async with producer.transaction(factory) as txn:
                    assert txn.session is not None
                    await txn.session.execute(orders.insert().values(id=committed[-1], amount=1))
                    await txn.send(topic, committed[-1], key=committed[-1])
                committed.append(unique("async-decorated"))
                await place_async(committed[-1])
            finally:
                await async_engine.dispose()

        asyncio.run(in_asyncio())

        running.agree(order_ids(engine), committed, declined)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_rollbacks_savepoints_and_commits_inside_a_session_without_autobegin(
    kafka_bootstrap: str, producer: OutboxProducer, engine: sa.Engine, topics: Topics
) -> None:
    """What the README's table says of a session's own rollback, savepoint, commit and close
    inside a transaction holds without autobegin too. After its own rollback the session has no
    transaction and begins none by itself: a statement then is SQLAlchemy's refusal, and one
    after the caller's ``session.begin()`` is part of the transaction the outbox commits."""
    producer.serve_checks(engine=engine, secret=SECRET)
    explicit = sessionmaker(engine, autobegin=False)
    committed: list[str] = []
    refused: list[str] = []

    with pipeline(kafka_bootstrap, topics) as running:
        topic = running.topic

        def insert(session: Session, order_id: str) -> None:
            session.execute(orders.insert().values(id=order_id, amount=1))

        # a rollback before any send, then the caller's own begin: goes on and commits
        committed.append(unique("rollback-then-begin"))
        refused.append(committed[-1] + "-rolled-back")
        with producer.transaction(explicit) as txn:
            assert txn.session is not None
            insert(txn.session, refused[-1])
            txn.session.rollback()
            txn.session.begin()
            insert(txn.session, committed[-1])
            txn.send(topic, committed[-1], key=committed[-1])
        # a savepoint rolled back with no send inside: goes on and commits
        committed.append(unique("savepoint"))
        refused.append(committed[-1] + "-savepoint")
        with producer.transaction(explicit) as txn:
            assert txn.session is not None
            with pytest.raises(Declined), txn.session.begin_nested():
                insert(txn.session, refused[-1])
                raise Declined
            insert(txn.session, committed[-1])
            txn.send(topic, committed[-1], key=committed[-1])
        # a rollback before any send, with no begin after it: the next statement is refused
        refused.append(unique("rollback-no-begin"))
        with (
            pytest.raises(sa.exc.InvalidRequestError, match="Autobegin is disabled"),
            producer.transaction(explicit) as txn,
        ):
            assert txn.session is not None
            txn.session.rollback()
            insert(txn.session, refused[-1])
            txn.send(topic, refused[-1], key=refused[-1])
        # a rollback or a close after a send, and a commit inside: refused, nothing delivered
        for end, error, match in (
            ("rollback", outbox.SendRolledBackError, "rolled back or closed"),
            ("close", outbox.SendRolledBackError, "rolled back or closed"),
            ("commit", outbox.CommitInsideTransactionError, r"session.commit\(\) was called"),
        ):
            refused.append(unique(f"{end}-after-send"))
            with pytest.raises(error, match=match), producer.transaction(explicit) as txn:
                assert txn.session is not None
                insert(txn.session, refused[-1])
                txn.send(topic, refused[-1], key=refused[-1])
                getattr(txn.session, end)()

        running.agree(order_ids(engine), committed, refused)

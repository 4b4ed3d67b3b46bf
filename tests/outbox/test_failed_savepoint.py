"""A ``SAVEPOINT`` statement that failed, then a ``ROLLBACK TO`` its name.

Savepoints written as SQL are followed by their statements
(:mod:`outbox.transaction_statements`): ``SAVEPOINT name`` is marked with the sends made so far
before it runs. On PostgreSQL a statement after an error fails too until a rollback, so a
helper that opens a savepoint of the same name in a transaction an error (caught and ignored)
left aborted gets an error instead of a savepoint; its caller's ``ROLLBACK TO SAVEPOINT name``
then goes to the *earlier* savepoint of that name, undoing the work and the evidence row of a
message sent after it. Marked as if it had run, the failed savepoint was the one the rollback
was judged by: no send since it, so the outbox committed, and the message was delivered for
work that was gone (a phantom). The failed statement now takes its mark back
(``statement_watch``'s ``handle_error``): the rollback is judged by the savepoint it really went
to, and the transaction is refused with ``SendRolledBackError``. PostgreSQL only: SQLite does
not abort its transaction on an error, so the same steps commit there.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session, sessionmaker

from outbox import OutboxProducer, SendRolledBackError
from tests.checker.test_checker import SECRET
from tests.outbox.test_asyncio import async_factory
from tests.pipeline import pipeline
from tests.producer_fixtures import Topics, evidence_ids, order_ids, orders

pytestmark = pytest.mark.integration


@pytest.fixture
def db_url(postgres_url: str) -> str:
    """PostgreSQL only: the failed statement is PostgreSQL's aborted transaction."""
    return postgres_url


def _attempt(session: Session, order: str, send: object) -> None:
    """A helper's savepoint, the same name at every level, as such helpers are written."""
    session.execute(sa.text("SAVEPOINT attempt"))
    try:
        assert callable(send)
        send(order)
        session.execute(orders.insert().values(id=order, amount=1))
        with contextlib.suppress(sa.exc.IntegrityError):  # "insert or ignore", done wrong
            session.execute(orders.insert().values(id=order, amount=1))
        _attempt_inner(session)
    except sa.exc.DBAPIError:
        session.execute(sa.text("ROLLBACK TO SAVEPOINT attempt"))


def _attempt_inner(session: Session) -> None:
    session.execute(sa.text("SAVEPOINT attempt"))  # refused: the transaction is aborted


async def _attempt_async(session: AsyncSession, order: str, send: object) -> None:
    await session.execute(sa.text("SAVEPOINT attempt"))
    try:
        assert callable(send)
        await send(order)
        await session.execute(orders.insert().values(id=order, amount=1))
        with contextlib.suppress(sa.exc.IntegrityError):
            await session.execute(orders.insert().values(id=order, amount=1))
        await session.execute(sa.text("SAVEPOINT attempt"))
    except sa.exc.DBAPIError:
        await session.execute(sa.text("ROLLBACK TO SAVEPOINT attempt"))


def test_a_rollback_past_a_failed_savepoint_undoes_the_send_before_it(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    session_factory: sessionmaker,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
) -> None:
    producer.serve_checks(engine=engine, secret=SECRET)
    with pipeline(kafka_bootstrap, topics) as running:
        orders_of = {form: f"{form[:5]}-{uuid.uuid4().hex[:8]}" for form in ("with", "async")}
        raised: dict[str, type[BaseException] | None] = dict.fromkeys(orders_of)
        txn_ids: list[str] = []
        try:
            with producer.transaction(session_factory) as txn:
                txn_ids.append(txn.txn_id)
                assert isinstance(txn.session, Session)
                order = orders_of["with"]
                _attempt(txn.session, order, lambda o: txn.send(running.topic, o, key=o))
        except Exception as err:
            raised["with"] = type(err)

        async def main() -> None:
            async with async_factory(db_url) as factory:
                try:
                    async with producer.transaction(factory) as atxn:
                        txn_ids.append(atxn.txn_id)
                        assert isinstance(atxn.session, AsyncSession)
                        order = orders_of["async"]
                        send = lambda o: atxn.send(running.topic, o, key=o)  # noqa: E731
                        await _attempt_async(atxn.session, order, send)
                except Exception as err:
                    raised["async"] = type(err)

        asyncio.run(main())
        # Then the database holds neither order nor evidence row, and no message came (before
        # the fix: no row, no evidence row, and each order delivered: COMMIT ops)
        decided = running.decided(txn_ids)
        rows = set(order_ids(engine))
        delivered = running.settle(lambda: set())
        seen = {form: (o in rows, delivered[o]) for form, o in orders_of.items()}
        assert seen == dict.fromkeys(orders_of, (False, 0)), "form: (row, deliveries)"
        assert not set(txn_ids) & set(evidence_ids(engine))
        assert decided == dict.fromkeys(txn_ids, "ROLLBACK")
        assert raised == dict.fromkeys(orders_of, SendRolledBackError)

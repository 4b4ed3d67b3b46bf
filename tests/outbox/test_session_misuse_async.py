"""The session-misuse scenarios of :mod:`tests.outbox.test_session_misuse` in asyncio.

A user inside ``async def`` under ``@outbox.transactional`` or ``async with
producer.transaction()`` may ``await session.rollback()``, roll back a savepoint (``async with
session.begin_nested()``), ``await session.close()`` or ``await session.commit()``. The
``AsyncSession`` runs each on the sync session the outbox watches, through a greenlet: each
scenario is run here with its op record lost (the checker resolves it, as after a crash)
against a real relay and checker, and ends with the user's view: the order rows in the database
and the orders a ``read_committed`` consumer received are the same set, and a refusal raised its
specific error.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

import outbox
from outbox import CommitInsideTransactionError, OutboxProducer, TransactionStatementError
from tests.checker.test_checker import SECRET
from tests.outbox import test_session_misuse as sync_misuse
from tests.outbox.test_asyncio import async_factory
from tests.outbox.test_session_misuse import OUTCOMES, Declined
from tests.pipeline import ops_lost, pipeline
from tests.producer_fixtures import Topics, order_ids, orders

pytestmark = pytest.mark.integration

Send = Callable[[str], Awaitable[object]]


async def _insert(session: AsyncSession, order_id: str) -> None:
    await session.execute(orders.insert().values(id=order_id, amount=1))


@dataclass
class Scenario:
    """``body(session, send, ids)`` runs inside the transaction; ``ids`` names its orders."""

    body: Callable[[AsyncSession, Send, list[str]], Awaitable[None]]
    raises: type[Exception] | None
    #: The orders that commit (and must be delivered) when it does not raise.
    committed: Callable[[list[str]], list[str]] = lambda ids: ids


async def rollback_after_send(s: AsyncSession, send: Send, ids: list[str]) -> None:
    await send(ids[0])
    await _insert(s, ids[0])
    await s.rollback()  # undoes the order and the evidence row written with the send
    await _insert(s, ids[1])  # ... and this commits in a new DB transaction


async def savepoint_with_first_send_rolled_back(
    s: AsyncSession, send: Send, ids: list[str]
) -> None:
    savepoint = await s.begin_nested()
    await send(ids[0])  # the evidence row goes into the savepoint
    await _insert(s, ids[0])
    await savepoint.rollback()
    await _insert(s, ids[1])


async def savepoint_with_a_later_send_rolled_back(
    s: AsyncSession, send: Send, ids: list[str]
) -> None:
    await send(ids[0])
    await _insert(s, ids[0])
    try:
        async with s.begin_nested():
            await send(ids[1])
            await _insert(s, ids[1])
            raise Declined(ids[1])
    except Declined:
        pass  # the user carries on; ids[1]'s message was sent, its row rolled back


async def savepoint_without_a_send_rolled_back(s: AsyncSession, send: Send, ids: list[str]) -> None:
    await send(ids[0])
    await _insert(s, ids[0])
    try:
        async with s.begin_nested():
            await _insert(s, ids[0])  # a duplicate key: the usual "insert or skip" pattern
    except sa.exc.IntegrityError:
        pass
    async with s.begin_nested():  # and a savepoint released with a send in it
        await send(ids[1])
        await _insert(s, ids[1])


async def close_after_send(s: AsyncSession, send: Send, ids: list[str]) -> None:
    await send(ids[0])
    await _insert(s, ids[0])
    await s.close()
    await _insert(s, ids[1])


async def commit_inside(s: AsyncSession, send: Send, ids: list[str]) -> None:
    await _insert(s, ids[0])
    await send(ids[0])
    await s.commit()


async def commit_inside_then_raise(s: AsyncSession, send: Send, ids: list[str]) -> None:
    await _insert(s, ids[0])
    await send(ids[0])
    with contextlib.suppress(CommitInsideTransactionError):
        await s.commit()
    raise Declined("after the commit")


async def commit_inside_caught(s: AsyncSession, send: Send, ids: list[str]) -> None:
    await _insert(s, ids[0])
    await send(ids[0])
    with contextlib.suppress(CommitInsideTransactionError):
        await s.commit()  # swallowed: the transaction must still not commit


async def commit_before_any_send(s: AsyncSession, send: Send, ids: list[str]) -> None:
    await _insert(s, ids[0])
    await s.commit()
    await send(ids[1])
    await _insert(s, ids[1])


async def commit_statement_then_raise(s: AsyncSession, send: Send, ids: list[str]) -> None:
    await _insert(s, ids[0])
    await send(ids[0])
    with contextlib.suppress(TransactionStatementError):
        await s.execute(sa.text("COMMIT"))
    raise Declined("after the COMMIT statement")


async def rollback_statement_after_send(s: AsyncSession, send: Send, ids: list[str]) -> None:
    await send(ids[0])
    await _insert(s, ids[0])
    await s.execute(sa.text("ROLLBACK"))
    await _insert(s, ids[1])


async def end_statement_caught(s: AsyncSession, send: Send, ids: list[str]) -> None:
    await _insert(s, ids[0])
    await send(ids[0])
    with contextlib.suppress(TransactionStatementError):
        await s.execute(sa.text("END"))


async def commit_statement_on_a_new_connection(s: AsyncSession, send: Send, ids: list[str]) -> None:
    await _insert(s, ids[0])
    await s.rollback()  # no send yet: fine; the session begins again on another connection
    await _insert(s, ids[1])
    await send(ids[1])
    with contextlib.suppress(TransactionStatementError):
        await s.execute(sa.text("COMMIT"))


async def commit_statement_past_a_do_execute_listener(
    s: AsyncSession, send: Send, ids: list[str]
) -> None:
    bind = s.get_bind()
    event.listen(bind, "do_execute", sync_misuse._run_it)
    try:
        await _insert(s, ids[0])
        await send(ids[0])
        with contextlib.suppress(TransactionStatementError):
            await s.execute(sa.text("COMMIT"))
    finally:
        event.remove(bind, "do_execute", sync_misuse._run_it)


#: The synchronous forms' scenarios, each with the same outcome: its body here is the coroutine
#: function of the same name as the synchronous one.
SCENARIOS = {
    name: Scenario(globals()[sync_misuse.BODIES[name].__name__], raises)
    for name, raises in OUTCOMES.items()
}

Form = Callable[
    [OutboxProducer, async_sessionmaker[AsyncSession], str, Scenario, list[str], list[str]],
    Awaitable[None],
]


async def run_decorated(
    producer: OutboxProducer,
    factory: async_sessionmaker[AsyncSession],
    topic: str,
    scenario: Scenario,
    ids: list[str],
    txn_ids: list[str],
) -> None:
    @outbox.transactional(producer=producer, session_factory=factory)
    async def place(*, session: AsyncSession) -> None:
        txn_ids.append(outbox.current_transaction().txn_id)
        await scenario.body(session, lambda order: outbox.send(topic, order, key=order), ids)

    await place()


async def run_in_context(
    producer: OutboxProducer,
    factory: async_sessionmaker[AsyncSession],
    topic: str,
    scenario: Scenario,
    ids: list[str],
    txn_ids: list[str],
) -> None:
    async with producer.transaction(factory) as txn:
        txn_ids.append(txn.txn_id)
        assert isinstance(txn.session, AsyncSession)
        await scenario.body(txn.session, lambda order: txn.send(topic, order, key=order), ids)


FORMS: dict[str, Form] = {"decorator": run_decorated, "with": run_in_context}


def test_async_rollbacks_savepoints_and_commits_inside_end_with_rows_and_messages_agreeing(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    producer.serve_checks(engine=engine, secret=SECRET)
    cases = [(form, name) for form in FORMS for name in SCENARIOS]
    with pipeline(kafka_bootstrap, topics) as running:
        orders_of: dict[tuple[str, str], list[str]] = {}
        txn_ids: list[str] = []
        raised: dict[tuple[str, str], type[BaseException] | None] = {}

        async def main() -> None:
            async with async_factory(db_url) as factory:
                for form, name in cases:
                    ids = [f"{name[:12]}-{uuid.uuid4().hex[:8]}" for _ in range(2)]
                    orders_of[form, name] = ids
                    raised[form, name] = None
                    try:
                        await FORMS[form](
                            producer, factory, running.topic, SCENARIOS[name], ids, txn_ids
                        )
                    except Exception as err:
                        raised[form, name] = type(err)

        # Given each scenario run in each form with its op record lost (the checker decides it)
        with ops_lost(producer, monkeypatch):
            asyncio.run(main())
        assert len(txn_ids) == len(cases)
        sent = {h.txn_id for h in topics.halves()}  # a refusal before any send sent nothing
        running.decided(set(txn_ids) & sent)
        # Then the database and the topic agree, scenario by scenario
        rows = set(order_ids(engine))
        expected = {
            case: set()
            if SCENARIOS[case[1]].raises
            else set(SCENARIOS[case[1]].committed(orders_of[case]))
            for case in cases
        }
        delivered = running.settle(lambda: set().union(*expected.values()))
        report = {
            case: (sorted(rows & set(ids)), sorted(set(delivered) & set(ids)))
            for case, ids in orders_of.items()
        }
        disagree = {c: r for c, r in report.items() if r[0] != r[1]}
        assert disagree == {}, (
            "(form, scenario): (rows in the DB, orders delivered) - both or neither"
        )
        assert {c: set(r[0]) for c, r in report.items()} == expected
        assert all(n == 1 for n in delivered.values()), delivered
        # and a refused transaction said why, with its specific error
        assert raised == {case: SCENARIOS[case[1]].raises for case in cases}

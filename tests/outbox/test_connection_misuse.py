"""The session's Connection used directly inside an outbox transaction never splits "DB change +
event".

:mod:`tests.outbox.test_session_misuse` walks what a user does through the ``Session``. Code
that reaches for the connection underneath - ``session.connection().commit()``, ``.rollback()``,
``.begin_nested()``, or savepoints written as SQL (``SAVEPOINT``, ``ROLLBACK TO SAVEPOINT``) -
goes past the session's events: SQLAlchemy tells the session nothing. So does a text of several
statements whose last one is a ``COMMIT`` (PostgreSQL's drivers run them all). Each scenario
runs in the decorator and the ``with`` form, synchronous and asyncio, with the producer's own op
record kept (the outbox decides where it can; the checker where it cannot know), against a real
relay and checker, and ends with what a user looks at: the order rows in the database and the
orders a ``read_committed`` consumer received are the same set, and the call raised what it
should.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

import outbox
from outbox import (
    OutboxProducer,
    SendRolledBackError,
    TransactionEndedError,
    TransactionStatementError,
)
from tests.checker.test_checker import SECRET
from tests.outbox import test_asyncio as asyncio_forms
from tests.outbox import test_session_misuse as session_misuse
from tests.outbox.test_asyncio import async_factory
from tests.outbox.test_session_misuse import Declined
from tests.pipeline import pipeline
from tests.producer_fixtures import Topics, order_ids

pytestmark = pytest.mark.integration


_insert = session_misuse._insert
_insert_async = asyncio_forms._insert


SyncBody = Callable[[Session, Callable[[str], Any], list[str]], None]
AsyncBody = Callable[[AsyncSession, Callable[[str], Awaitable[Any]], list[str]], Awaitable[None]]


@dataclass
class Scenario:
    """The same steps as a synchronous and an asyncio body; what the call raises; which of its
    two orders commit (and so must be delivered, once)."""

    sync: SyncBody
    run_async: AsyncBody
    raises: type[Exception] | None
    committed: Callable[[list[str]], list[str]] = field(default=lambda ids: ids)


# -- savepoints the session does not see --------------------------------------------------------


def core_savepoint_holding_a_send_rolled_back(s: Session, send: Callable, ids: list[str]) -> None:
    send(ids[0])
    _insert(s, ids[0])
    savepoint = s.connection().begin_nested()
    send(ids[1])
    _insert(s, ids[1])
    savepoint.rollback()  # ids[1]'s order is undone; its message was sent


async def core_savepoint_holding_a_send_rolled_back_async(
    s: AsyncSession, send: Callable, ids: list[str]
) -> None:
    await send(ids[0])
    await _insert_async(s, ids[0])
    savepoint = await (await s.connection()).begin_nested()
    await send(ids[1])
    await _insert_async(s, ids[1])
    await savepoint.rollback()


def core_savepoint_without_a_send_rolled_back(s: Session, send: Callable, ids: list[str]) -> None:
    send(ids[0])
    _insert(s, ids[0])
    with contextlib.suppress(sa.exc.IntegrityError), s.connection().begin_nested():
        _insert(s, ids[0])  # a duplicate key: "insert or skip", no send inside
    send(ids[1])
    _insert(s, ids[1])


async def core_savepoint_without_a_send_rolled_back_async(
    s: AsyncSession, send: Callable, ids: list[str]
) -> None:
    await send(ids[0])
    await _insert_async(s, ids[0])
    with contextlib.suppress(sa.exc.IntegrityError):
        async with (await s.connection()).begin_nested():
            await _insert_async(s, ids[0])
    await send(ids[1])
    await _insert_async(s, ids[1])


def savepoint_as_the_first_write_then_raise(s: Session, send: Callable, ids: list[str]) -> None:
    with s.begin_nested():  # on SQLite's driver, its RELEASE committed everything
        _insert(s, ids[0])
        send(ids[0])
    raise Declined("after the savepoint")


async def savepoint_as_the_first_write_then_raise_async(
    s: AsyncSession, send: Callable, ids: list[str]
) -> None:
    async with s.begin_nested():
        await _insert_async(s, ids[0])
        await send(ids[0])
    raise Declined("after the savepoint")


def sql_savepoint_holding_a_send_rolled_back(s: Session, send: Callable, ids: list[str]) -> None:
    send(ids[0])
    _insert(s, ids[0])
    s.execute(sa.text("SAVEPOINT second_order"))
    send(ids[1])
    _insert(s, ids[1])
    s.execute(sa.text("ROLLBACK TO SAVEPOINT second_order"))


async def sql_savepoint_holding_a_send_rolled_back_async(
    s: AsyncSession, send: Callable, ids: list[str]
) -> None:
    await send(ids[0])
    await _insert_async(s, ids[0])
    await s.execute(sa.text("SAVEPOINT second_order"))
    await send(ids[1])
    await _insert_async(s, ids[1])
    await s.execute(sa.text("ROLLBACK TO SAVEPOINT second_order"))


#: SQL savepoints rolled back with no send in them, and one released with a send in it: nothing
#: to refuse (a quoted name, and a name that differs only in case, are the same savepoint).
SQL_SAVEPOINTS_WITHOUT_A_SEND_ROLLED_BACK = [
    ('SAVEPOINT "Attempt"', None),
    ("", "insert 0"),
    ('ROLLBACK TO SAVEPOINT "Attempt"', None),  # undoes that first insert
    ('RELEASE SAVEPOINT "Attempt"', None),
    ("SAVEPOINT Held", None),
    ("", "send 0"),
    ("release savepoint held", None),
    ("", "send 1"),
]


def sql_savepoints_without_a_send_rolled_back(s: Session, send: Callable, ids: list[str]) -> None:
    for statement, step in SQL_SAVEPOINTS_WITHOUT_A_SEND_ROLLED_BACK:
        if statement:
            s.execute(sa.text(statement))
        elif step is not None:
            what, i = step.split()
            if what == "send":
                send(ids[int(i)])
            _insert(s, ids[int(i)])


async def sql_savepoints_without_a_send_rolled_back_async(
    s: AsyncSession, send: Callable, ids: list[str]
) -> None:
    for statement, step in SQL_SAVEPOINTS_WITHOUT_A_SEND_ROLLED_BACK:
        if statement:
            await s.execute(sa.text(statement))
        elif step is not None:
            what, i = step.split()
            if what == "send":
                await send(ids[int(i)])
            await _insert_async(s, ids[int(i)])


# -- the session's transaction committed or rolled back through its Connection ------------------


def connection_commit_then_raise(s: Session, send: Callable, ids: list[str]) -> None:
    _insert(s, ids[0])
    send(ids[0])
    s.connection().commit()  # the order and the evidence row are durable now
    raise Declined("after the connection's commit")


async def connection_commit_then_raise_async(
    s: AsyncSession, send: Callable, ids: list[str]
) -> None:
    await _insert_async(s, ids[0])
    await send(ids[0])
    await (await s.connection()).commit()
    raise Declined("after the connection's commit")


def connection_commit_then_a_send(s: Session, send: Callable, ids: list[str]) -> None:
    _insert(s, ids[0])
    send(ids[0])
    s.connection().commit()
    send(ids[1])  # its work runs in a database transaction the outbox does not commit
    _insert(s, ids[1])


async def connection_commit_then_a_send_async(
    s: AsyncSession, send: Callable, ids: list[str]
) -> None:
    await _insert_async(s, ids[0])
    await send(ids[0])
    await (await s.connection()).commit()
    await send(ids[1])
    await _insert_async(s, ids[1])


def connection_commit_then_more_work(s: Session, send: Callable, ids: list[str]) -> None:
    _insert(s, ids[0])
    send(ids[0])
    s.connection().commit()
    _insert(s, ids[1])


async def connection_commit_then_more_work_async(
    s: AsyncSession, send: Callable, ids: list[str]
) -> None:
    await _insert_async(s, ids[0])
    await send(ids[0])
    await (await s.connection()).commit()
    await _insert_async(s, ids[1])


def connection_rollback_after_send(s: Session, send: Callable, ids: list[str]) -> None:
    send(ids[0])
    _insert(s, ids[0])
    s.connection().rollback()  # undoes the order and the evidence row
    _insert(s, ids[1])


async def connection_rollback_after_send_async(
    s: AsyncSession, send: Callable, ids: list[str]
) -> None:
    await send(ids[0])
    await _insert_async(s, ids[0])
    await (await s.connection()).rollback()
    await _insert_async(s, ids[1])


def commit_in_a_text_of_several_statements(s: Session, send: Callable, ids: list[str]) -> None:
    _insert(s, ids[0])
    send(ids[0])
    with contextlib.suppress(TransactionStatementError):  # PostgreSQL would run both
        s.execute(sa.text(f"UPDATE orders SET amount = 2 WHERE id = '{ids[0]}'; COMMIT"))
    raise Declined("after the text")


async def commit_in_a_text_of_several_statements_async(
    s: AsyncSession, send: Callable, ids: list[str]
) -> None:
    await _insert_async(s, ids[0])
    await send(ids[0])
    with contextlib.suppress(TransactionStatementError):
        await s.execute(sa.text(f"UPDATE orders SET amount = 2 WHERE id = '{ids[0]}'; COMMIT"))
    raise Declined("after the text")


#: PostgreSQL's E'...' string holding an escaped quote, then a COMMIT (read as a plain string,
#: the quote ended it and the next one opened a string that hid the COMMIT).
E_STRING_THEN_COMMIT = (
    "UPDATE orders SET amount = 2 WHERE id = '{}' AND position(E'\\'' in id) = 0; COMMIT; "
    "SELECT 'done'"
)


def commit_after_an_e_string(s: Session, send: Callable, ids: list[str]) -> None:
    _insert(s, ids[0])
    send(ids[0])
    with contextlib.suppress(TransactionStatementError):
        s.execute(sa.text(E_STRING_THEN_COMMIT.format(ids[0])))
    raise Declined("after the text")


async def commit_after_an_e_string_async(s: AsyncSession, send: Callable, ids: list[str]) -> None:
    await _insert_async(s, ids[0])
    await send(ids[0])
    with contextlib.suppress(TransactionStatementError):
        await s.execute(sa.text(E_STRING_THEN_COMMIT.format(ids[0])))
    raise Declined("after the text")


def _first(ids: list[str]) -> list[str]:
    return ids[:1]


def _scenario(
    body: SyncBody, raises: type[Exception] | None, committed: Callable | None = None
) -> Scenario:
    twin = globals()[body.__name__ + "_async"]
    return Scenario(body, twin, raises, committed or ((lambda ids: []) if raises else list))


SCENARIOS = {
    "core savepoint holding a send rolled back": _scenario(
        core_savepoint_holding_a_send_rolled_back, SendRolledBackError
    ),
    "core savepoint without a send rolled back": _scenario(
        core_savepoint_without_a_send_rolled_back, None
    ),
    "savepoint as the first write, then raise": _scenario(
        savepoint_as_the_first_write_then_raise, Declined
    ),
    "SQL savepoint holding a send rolled back": _scenario(
        sql_savepoint_holding_a_send_rolled_back, SendRolledBackError
    ),
    "SQL savepoints without a send rolled back": _scenario(
        sql_savepoints_without_a_send_rolled_back, None
    ),
    # what ran before the connection's commit is durable, with the messages sent before it
    "connection commit, then raise": _scenario(connection_commit_then_raise, Declined, _first),
    "connection commit, then a send": _scenario(
        connection_commit_then_a_send, TransactionEndedError, _first
    ),
    "connection commit, then more work": _scenario(
        connection_commit_then_more_work, TransactionEndedError, _first
    ),
    "connection rollback after a send": _scenario(
        connection_rollback_after_send, TransactionEndedError
    ),
    # the statement check reads every statement of a text, not its first alone
    "COMMIT in a text of several statements": _scenario(
        commit_in_a_text_of_several_statements, Declined
    ),
    "COMMIT after an E-string with an escaped quote": _scenario(commit_after_an_e_string, Declined),
}


def _sync_forms(
    producer: OutboxProducer, factory: sessionmaker, topic: str
) -> dict[str, Callable[[Scenario, list[str], list[str]], None]]:
    def decorated(scenario: Scenario, ids: list[str], txn_ids: list[str]) -> None:
        @outbox.transactional(producer=producer, session_factory=factory)
        def place(*, session: Session) -> None:
            txn_ids.append(outbox.current_transaction().txn_id)
            scenario.sync(session, lambda order: outbox.send(topic, order, key=order), ids)

        place()

    def in_context(scenario: Scenario, ids: list[str], txn_ids: list[str]) -> None:
        with producer.transaction(factory) as txn:
            txn_ids.append(txn.txn_id)
            assert txn.session is not None
            scenario.sync(txn.session, lambda order: txn.send(topic, order, key=order), ids)

    return {"decorator": decorated, "with": in_context}


async def _run_async_forms(
    producer: OutboxProducer,
    factory: async_sessionmaker[AsyncSession],
    topic: str,
    cases: dict[tuple[str, str], list[str]],
    txn_ids: list[str],
    raised: dict[tuple[str, str], type[BaseException] | None],
) -> None:
    for (form, name), ids in cases.items():
        scenario = SCENARIOS[name]

        @outbox.transactional(producer=producer, session_factory=factory)
        async def place(*, session: AsyncSession) -> None:
            txn_ids.append(outbox.current_transaction().txn_id)
            send = lambda order: outbox.send(topic, order, key=order)  # noqa: E731
            await scenario.run_async(session, send, ids)  # noqa: B023 - awaited here

        raised[form, name] = None
        try:
            if form == "async decorator":
                await place()
            else:
                async with producer.transaction(factory) as txn:
                    txn_ids.append(txn.txn_id)
                    assert isinstance(txn.session, AsyncSession)
                    send = lambda order: txn.send(topic, order, key=order)  # noqa: E731
                    await scenario.run_async(txn.session, send, ids)
        except Exception as err:
            raised[form, name] = type(err)


def test_the_connection_under_the_session_cannot_split_rows_from_messages(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    session_factory: sessionmaker,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
) -> None:
    producer.serve_checks(engine=engine, secret=SECRET)
    with pipeline(kafka_bootstrap, topics) as running:
        forms = ["decorator", "with", "async decorator", "async with"]
        cases = {
            (form, name): [f"{name[:10]}-{uuid.uuid4().hex[:8]}" for _ in range(2)]
            for form in forms
            for name in SCENARIOS
        }
        txn_ids: list[str] = []
        raised: dict[tuple[str, str], type[BaseException] | None] = {}
        # Given each scenario in each form, the producer's op records kept
        run = _sync_forms(producer, session_factory, running.topic)
        for (form, name), ids in cases.items():
            if form in run:
                raised[form, name] = None
                try:
                    run[form](SCENARIOS[name], ids, txn_ids)
                except Exception as err:
                    raised[form, name] = type(err)

        async def main() -> None:
            async with async_factory(db_url) as factory:
                mine = {case: ids for case, ids in cases.items() if case[0].startswith("async")}
                await _run_async_forms(producer, factory, running.topic, mine, txn_ids, raised)

        asyncio.run(main())
        assert len(txn_ids) == len(cases)
        # When every transaction that sent a half record is decided (by its op or a check)
        sent = {h.txn_id for h in topics.halves()}
        running.decided(set(txn_ids) & sent)
        # Then the database and the topic agree, case by case
        rows = set(order_ids(engine))
        expected = {case: set(SCENARIOS[case[1]].committed(ids)) for case, ids in cases.items()}
        try:
            delivered = running.settle(lambda: set().union(*expected.values()), timeout=30)
        except AssertionError:  # the report below says which cases lost or invented
            delivered = running.delivered()
        report = {
            case: (sorted(rows & set(ids)), sorted(set(delivered) & set(ids)))
            for case, ids in cases.items()
        }
        disagree = {c: r for c, r in report.items() if r[0] != r[1]}
        assert disagree == {}, "(form, scenario): (rows in the DB, orders delivered)"
        assert {c: set(r[0]) for c, r in report.items()} == expected
        assert all(n == 1 for n in delivered.values()), delivered
        # and each call raised what it should (the user's own exception passes through)
        assert raised == {case: SCENARIOS[case[1]].raises for case in cases}

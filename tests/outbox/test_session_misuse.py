"""Ordinary SQLAlchemy calls inside an outbox transaction never split "DB change + event".

A user inside ``@outbox.transactional`` or ``producer.transaction()`` may roll back the session,
roll back a savepoint, close the session or commit it. Each scenario runs with its op record
lost (the checker resolves it, as after a crash) against a real relay and checker, and ends
with the user's view: the order rows in the database and the orders a ``read_committed``
consumer received must be the same set. Where the outbox refuses, it raises a specific error
and neither happens.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

import outbox
from outbox import (
    CommitInsideTransactionError,
    OutboxProducer,
    SendRolledBackError,
    TransactionStatementError,
)
from tests.checker.test_checker import SECRET
from tests.kafka_helpers import set_topic_config
from tests.pipeline import ops_lost, pipeline
from tests.producer_fixtures import Topics, evidence_ids, order_ids, orders

pytestmark = pytest.mark.integration


class Declined(Exception):
    pass


def _insert(session: Session, order_id: str) -> None:
    session.execute(orders.insert().values(id=order_id, amount=1))


@dataclass
class Scenario:
    """``body(session, send, ids)`` runs inside the transaction; ``ids`` names its orders."""

    body: Callable[[Session, Callable[[str], None], list[str]], None]
    raises: type[Exception] | None
    #: The orders that commit (and must be delivered) when it does not raise.
    committed: Callable[[list[str]], list[str]] = lambda ids: ids


def rollback_after_send(s: Session, send: Callable[[str], None], ids: list[str]) -> None:
    send(ids[0])
    _insert(s, ids[0])
    s.rollback()  # undoes the order and the evidence row written with the send
    _insert(s, ids[1])  # ... and this commits in a new DB transaction


def savepoint_with_first_send_rolled_back(s: Session, send: Callable, ids: list[str]) -> None:
    savepoint = s.begin_nested()
    send(ids[0])  # the evidence row goes into the savepoint
    _insert(s, ids[0])
    savepoint.rollback()
    _insert(s, ids[1])


def savepoint_with_a_later_send_rolled_back(s: Session, send: Callable, ids: list[str]) -> None:
    send(ids[0])
    _insert(s, ids[0])
    try:
        with s.begin_nested():
            send(ids[1])
            _insert(s, ids[1])
            raise Declined(ids[1])
    except Declined:
        pass  # the user carries on; ids[1]'s message was sent, its row rolled back


def savepoint_without_a_send_rolled_back(s: Session, send: Callable, ids: list[str]) -> None:
    send(ids[0])
    _insert(s, ids[0])
    try:
        with s.begin_nested():
            _insert(s, ids[0])  # a duplicate key: the usual "insert or skip" pattern
    except sa.exc.IntegrityError:
        pass
    with s.begin_nested():  # and a savepoint released with a send in it
        send(ids[1])
        _insert(s, ids[1])


def close_after_send(s: Session, send: Callable[[str], None], ids: list[str]) -> None:
    send(ids[0])
    _insert(s, ids[0])
    s.close()
    _insert(s, ids[1])


def commit_inside(s: Session, send: Callable[[str], None], ids: list[str]) -> None:
    _insert(s, ids[0])
    send(ids[0])
    s.commit()


def commit_inside_then_raise(s: Session, send: Callable[[str], None], ids: list[str]) -> None:
    _insert(s, ids[0])
    send(ids[0])
    with contextlib.suppress(CommitInsideTransactionError):
        s.commit()
    raise Declined("after the commit")


def commit_inside_caught(s: Session, send: Callable[[str], None], ids: list[str]) -> None:
    _insert(s, ids[0])
    send(ids[0])
    with contextlib.suppress(CommitInsideTransactionError):
        s.commit()  # swallowed: the transaction must still not commit


def commit_before_any_send(s: Session, send: Callable[[str], None], ids: list[str]) -> None:
    _insert(s, ids[0])
    s.commit()
    send(ids[1])
    _insert(s, ids[1])


def commit_statement_then_raise(s: Session, send: Callable[[str], None], ids: list[str]) -> None:
    _insert(s, ids[0])
    send(ids[0])
    with contextlib.suppress(TransactionStatementError):
        s.execute(sa.text("COMMIT"))  # would make the order and the evidence row durable
    raise Declined("after the COMMIT statement")


def rollback_statement_after_send(s: Session, send: Callable[[str], None], ids: list[str]) -> None:
    send(ids[0])
    _insert(s, ids[0])
    s.execute(sa.text("ROLLBACK"))  # would undo the order and the evidence row
    _insert(s, ids[1])


def end_statement_caught(s: Session, send: Callable[[str], None], ids: list[str]) -> None:
    _insert(s, ids[0])
    send(ids[0])
    with contextlib.suppress(TransactionStatementError):
        s.execute(sa.text("END"))  # swallowed: the transaction must still not commit


def commit_statement_on_a_new_connection(s: Session, send: Callable, ids: list[str]) -> None:
    _insert(s, ids[0])
    s.rollback()  # no send yet: fine; the session begins again on another connection
    _insert(s, ids[1])
    send(ids[1])
    with contextlib.suppress(TransactionStatementError):
        s.execute(sa.text("COMMIT"))  # swallowed: still refused on the new connection


def _run_it(cursor: Any, statement: str, parameters: Any, context: Any) -> bool:
    cursor.execute(statement, parameters)
    return True  # the statement ran here: the dialect's own execute is skipped


def commit_statement_past_a_do_execute_listener(s: Session, send: Callable, ids: list[str]) -> None:
    """The application's own ``do_execute`` listener (tracing, a statement rewriter) runs every
    statement itself: the COMMIT statement must be refused all the same."""
    bind = s.get_bind()
    event.listen(bind, "do_execute", _run_it)
    try:
        _insert(s, ids[0])
        send(ids[0])
        with contextlib.suppress(TransactionStatementError):
            s.execute(sa.text("COMMIT"))
    finally:
        event.remove(bind, "do_execute", _run_it)


#: What each scenario raises (None: it commits), in every form: the asyncio forms'
#: (:mod:`tests.outbox.test_session_misuse_async`) run the same scenarios to the same ends.
OUTCOMES: dict[str, type[Exception] | None] = {
    "rollback after send": SendRolledBackError,
    "savepoint holding the first send rolled back": SendRolledBackError,
    "savepoint holding a later send rolled back": SendRolledBackError,
    "savepoint without a send rolled back": None,
    "close after send": SendRolledBackError,
    "commit inside": CommitInsideTransactionError,
    # the user's own exception propagates; the transaction rolled back all the same
    "commit inside, then raise": Declined,
    "commit inside, error swallowed": CommitInsideTransactionError,
    "commit before any send": CommitInsideTransactionError,
    # the same steps as SQL statements over the session's connection
    "COMMIT statement, then raise": Declined,
    "ROLLBACK statement after send": TransactionStatementError,
    "END statement, error swallowed": TransactionStatementError,
    "COMMIT statement on a new connection": TransactionStatementError,
    "COMMIT statement past a do_execute listener": TransactionStatementError,
}

BODIES = {
    "rollback after send": rollback_after_send,
    "savepoint holding the first send rolled back": savepoint_with_first_send_rolled_back,
    "savepoint holding a later send rolled back": savepoint_with_a_later_send_rolled_back,
    "savepoint without a send rolled back": savepoint_without_a_send_rolled_back,
    "close after send": close_after_send,
    "commit inside": commit_inside,
    "commit inside, then raise": commit_inside_then_raise,
    "commit inside, error swallowed": commit_inside_caught,
    "commit before any send": commit_before_any_send,
    "COMMIT statement, then raise": commit_statement_then_raise,
    "ROLLBACK statement after send": rollback_statement_after_send,
    "END statement, error swallowed": end_statement_caught,
    "COMMIT statement on a new connection": commit_statement_on_a_new_connection,
    "COMMIT statement past a do_execute listener": commit_statement_past_a_do_execute_listener,
}
SCENARIOS = {name: Scenario(BODIES[name], raises) for name, raises in OUTCOMES.items()}


def run_decorated(
    producer: OutboxProducer, factory: sessionmaker, topic: str, scenario: Scenario, ids: list
) -> tuple[str, type[BaseException] | None]:
    txn_ids: list[str] = []

    @outbox.transactional(producer=producer, session_factory=factory)
    def place(*, session: Session) -> None:
        txn_ids.append(outbox.current_transaction().txn_id)
        scenario.body(session, lambda order: outbox.send(topic, order, key=order), ids)

    raised = _run(place)
    return txn_ids[0], raised


def run_in_context(
    producer: OutboxProducer, factory: sessionmaker, topic: str, scenario: Scenario, ids: list
) -> tuple[str, type[BaseException] | None]:
    txn_ids: list[str] = []

    def place() -> None:
        with producer.transaction(factory) as txn:
            txn_ids.append(txn.txn_id)
            assert txn.session is not None
            scenario.body(txn.session, lambda order: txn.send(topic, order, key=order), ids)

    raised = _run(place)
    return txn_ids[0], raised


def _run(place: Callable[[], None]) -> type[BaseException] | None:
    """What the call raised (its type), if anything: judged after the database and the topic."""
    try:
        place()
    except Exception as err:
        return type(err)
    return None


@pytest.mark.parametrize("form", [run_decorated, run_in_context], ids=["decorator", "with"])
def test_rollbacks_savepoints_and_commits_inside_end_with_rows_and_messages_agreeing(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    session_factory: sessionmaker,
    engine: sa.Engine,
    topics: Topics,
    monkeypatch: pytest.MonkeyPatch,
    form: Callable[..., str],
) -> None:
    producer.serve_checks(engine=engine, secret=SECRET)
    with pipeline(kafka_bootstrap, topics) as running:
        orders_of: dict[str, list[str]] = {}
        txn_ids = []
        raised = {}
        # Given each scenario run with its op record lost (the checker decides it)
        with ops_lost(producer, monkeypatch):
            for name, scenario in SCENARIOS.items():
                ids = [f"{name[:12]}-{uuid.uuid4().hex[:8]}" for _ in range(2)]
                orders_of[name] = ids
                txn_id, raised[name] = form(producer, session_factory, running.topic, scenario, ids)
                txn_ids.append(txn_id)
        sent = {h.txn_id for h in topics.halves()}  # a refusal before any send sent nothing
        running.decided(set(txn_ids) & sent)
        # Then the database and the topic agree, scenario by scenario
        rows = set(order_ids(engine))
        expected = {
            name: set() if s.raises else set(s.committed(orders_of[name]))
            for name, s in SCENARIOS.items()
        }
        delivered = running.settle(lambda: set().union(*expected.values()))
        report = {
            name: (sorted(rows & set(ids)), sorted(set(delivered) & set(ids)))
            for name, ids in orders_of.items()
        }
        disagree = {n: r for n, r in report.items() if r[0] != r[1]}
        assert disagree == {}, "scenario: (rows in the DB, orders delivered) - both or neither"
        assert {n: set(r[0]) for n, r in report.items()} == expected
        assert all(n == 1 for n in delivered.values()), delivered
        # and a refused transaction said why, with its specific error
        assert raised == {n: s.raises for n, s in SCENARIOS.items()}


def test_a_session_the_caller_passes_is_the_transactions_session(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    session_factory: sessionmaker,
    engine: sa.Engine,
    topics: Topics,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a decorated function called with the caller's own session, by keyword and by
    # position, its op lost: its writes must commit with its evidence row, not apart from it
    producer.serve_checks(engine=engine, secret=SECRET)
    with pipeline(kafka_bootstrap, topics) as running:

        @outbox.transactional(producer=producer, session_factory=session_factory)
        def place(order_id: str, session: Session) -> str:
            outbox.send(running.topic, order_id, key=order_id)
            _insert(session, order_id)
            return outbox.current_transaction().txn_id

        ids = [f"given-{uuid.uuid4().hex[:8]}" for _ in range(2)]
        with ops_lost(producer, monkeypatch):
            with session_factory() as mine:
                by_keyword = place(ids[0], session=mine)
            with session_factory() as mine:
                by_position = place(ids[1], mine)
        assert running.decided([by_keyword, by_position]) == {
            by_keyword: "COMMIT",
            by_position: "COMMIT",
        }
        assert set(ids) <= set(order_ids(engine))
        assert running.settle(lambda: set(ids)) == dict.fromkeys(ids, 1)

        # and a nested call given another session than the outer transaction's is refused
        @outbox.transactional(producer=producer, session_factory=session_factory)
        def outer(*, session: Session) -> None:
            with session_factory() as other:
                place("nested-apart", session=other)

        with pytest.raises(outbox.ConfigurationError, match="another session"):
            outer()
        assert "nested-apart" not in order_ids(engine)


def test_a_send_failure_the_code_caught_refuses_the_commit(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    session_factory: sessionmaker,
    engine: sa.Engine,
    topics: Topics,
) -> None:
    """A send Kafka refused, caught by the code, which goes on to commit: the outbox refuses
    (the records may be partly on the half topic, the evidence row missing), and rolls back.
    Reading the send's coordinates makes it wait for the acknowledgement there (on PostgreSQL
    ``outbox.send()`` alone returns before it: the next test)."""
    set_topic_config(kafka_bootstrap, topics.settings.topics.half, "max.message.bytes", "2048")
    order_id = f"caught-{uuid.uuid4().hex[:8]}"

    caught: list[outbox.HalfSendError] = []

    @outbox.transactional(producer=producer, session_factory=session_factory)
    def place(*, session: Session) -> None:
        try:
            sending = outbox.send("orders", "x" * 5000, key=order_id)
            assert sending.coordinates  # waits here: refused by the broker
        except outbox.HalfSendError as err:
            caught.append(err)  # and the code goes on
        _insert(session, order_id)

    refused: outbox.HalfSendError | None = None
    try:
        place()
    except outbox.HalfSendError as err:
        refused = err
    assert len(caught) == 1, "the broker took a record over the topic's max.message.bytes"
    assert refused is not None and "cannot commit" in str(refused), refused
    assert order_id not in order_ids(engine)


def test_a_send_refused_after_the_code_went_on_refuses_the_commit(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    session_factory: sessionmaker,
    engine: sa.Engine,
    topics: Topics,
    db_url: str,
) -> None:
    """A send Kafka refuses, its refusal not yet known when ``outbox.send()`` returned
    (PostgreSQL: the code goes on while the records travel): the COMMIT waits for the answer and
    does not happen; the refusal is raised from the transaction and nothing is committed."""
    set_topic_config(kafka_bootstrap, topics.settings.topics.half, "max.message.bytes", "2048")
    order_id = f"refused-{uuid.uuid4().hex[:8]}"
    calls: list[str] = []

    @outbox.transactional(producer=producer, session_factory=session_factory)
    def place(*, session: Session) -> None:
        calls.append(outbox.current_transaction().txn_id)
        outbox.send("orders", "x" * 5000, key=order_id)  # refused by the broker
        calls.append("went on")
        _insert(session, order_id)

    with pytest.raises(outbox.HalfSendError, match="refused"):
        place()
    # SQLite's send waits for the answer (and raises there); PostgreSQL's code went on
    txn_id = calls[0]
    assert calls[1:] == ([] if db_url.startswith("sqlite") else ["went on"])
    # And nothing committed: no order, no evidence row
    assert order_id not in order_ids(engine)
    assert txn_id not in evidence_ids(engine)

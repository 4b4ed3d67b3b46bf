"""Checks on one connection's statements (:mod:`outbox.statement_watch`): run before each
statement of the watched connection only, for as long as it is watched, through one listener per
engine that every outbox transaction shares. What the checks refuse end to end is in
``tests/outbox/test_other_databases.py`` and ``tests/outbox/test_session_misuse.py``; here, the
bounds: nothing of a transaction is left behind when it ends, whatever the traffic."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from outbox import statement_watch
from outbox.errors import MultipleDatabasesError, TransactionStatementError
from outbox.session_guard import SessionGuard


class Refused(Exception):
    pass


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[sa.Engine]:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'watch.db'}")
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")
    yield engine
    engine.dispose()


def rows(engine: sa.Engine) -> list[int]:
    with engine.connect() as conn:
        return [x for (x,) in conn.exec_driver_sql("SELECT x FROM t ORDER BY x")]


def refuse_inserts(seen: list[str]) -> statement_watch.Check:
    def check(conn: sa.Connection, statement: str) -> None:
        seen.append(statement)
        if statement.startswith("INSERT"):
            raise Refused(statement)

    return check


def test_a_check_sees_its_connections_statements_only_while_watched(engine: sa.Engine) -> None:
    seen: list[str] = []
    with engine.connect() as watched, engine.connect() as other:
        stop = statement_watch.watch(watched, refuse_inserts(seen))
        with pytest.raises(Refused):
            watched.exec_driver_sql("INSERT INTO t VALUES (1)")
        watched.exec_driver_sql("SELECT 1")
        other.exec_driver_sql("INSERT INTO t VALUES (2)")  # another connection: not checked
        other.commit()
        assert seen == ["INSERT INTO t VALUES (1)", "SELECT 1"]
        stop()
        watched.exec_driver_sql("INSERT INTO t VALUES (3)")  # no longer watched
        watched.commit()
        assert seen == ["INSERT INTO t VALUES (1)", "SELECT 1"]
    assert rows(engine) == [2, 3]  # the refused statement never ran
    assert statement_watch.watched() == 0


def test_two_checks_on_one_connection_stop_one_at_a_time(engine: sa.Engine) -> None:
    first: list[str] = []
    second: list[str] = []
    with engine.connect() as conn:
        stop_first = statement_watch.watch(conn, refuse_inserts(first))
        stop_second = statement_watch.watch(conn, refuse_inserts(second))
        conn.exec_driver_sql("SELECT 1")
        stop_first()
        stop_first()  # twice: harmless
        with pytest.raises(Refused):
            conn.exec_driver_sql("INSERT INTO t VALUES (1)")
        stop_second()
        conn.exec_driver_sql("INSERT INTO t VALUES (2)")
        conn.commit()
    assert first == ["SELECT 1"]
    assert second == ["SELECT 1", "INSERT INTO t VALUES (1)"]
    assert rows(engine) == [2]
    assert statement_watch.watched() == 0


def test_an_engine_made_by_execution_options_is_watched_through_either(engine: sa.Engine) -> None:
    tagged = engine.execution_options(logging_token="ledger")
    seen: list[str] = []
    # Hooked through the derived engine first, then through the one it came from: each
    # connection's checks run (twice on the derived engine's, which refuses nothing more).
    with tagged.connect() as derived:
        stop = statement_watch.watch(derived, refuse_inserts(seen))
        with pytest.raises(Refused):
            derived.exec_driver_sql("INSERT INTO t VALUES (1)")
        stop()
    with engine.connect() as plain:
        stop = statement_watch.watch(plain, refuse_inserts(seen))
        with pytest.raises(Refused):
            plain.exec_driver_sql("INSERT INTO t VALUES (2)")
        stop()
    with tagged.connect() as derived:
        stop = statement_watch.watch(derived, refuse_inserts(seen))
        derived.exec_driver_sql("SELECT 1")
        stop()
    assert rows(engine) == []
    assert "SELECT 1" in seen


def test_ten_thousand_guarded_transactions_leave_one_listener_and_no_check(
    engine: sa.Engine, tmp_path: Path
) -> None:
    """The outbox's own watch (a session guard, its ``after_begin`` hook): the evidence row's
    connection refuses a COMMIT written as SQL, a second engine's refuses a write, and after
    10,000 transactions each engine holds the one listener it had after the first, and no
    connection is watched: nothing grows with traffic."""
    second = sa.create_engine(f"sqlite:///{tmp_path / 'second.db'}")
    with second.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")

    def transaction(i: int) -> None:
        with Session(engine) as session:
            guard = SessionGuard.attach(session, f"txn-{i}")
            try:
                session.execute(sa.text("INSERT INTO t VALUES (:x)"), {"x": i})
                if i % 1000 == 0:
                    with pytest.raises(TransactionStatementError):
                        session.execute(sa.text("COMMIT"))
                    with second.connect() as other:
                        other.exec_driver_sql("SELECT 1")  # not begun by the session: not watched
                    other_session = session.connection(bind_arguments={"bind": second})
                    with pytest.raises(MultipleDatabasesError):
                        other_session.exec_driver_sql("INSERT INTO t VALUES (1)")
                session.rollback()
            finally:
                guard.detach()

    transaction(0)
    listeners = len(engine.dispatch.before_cursor_execute)
    second_listeners = len(second.dispatch.before_cursor_execute)
    assert listeners == second_listeners == 1
    for i in range(1, 10_001):
        transaction(i)
    assert len(engine.dispatch.before_cursor_execute) == listeners
    assert len(second.dispatch.before_cursor_execute) == second_listeners
    assert statement_watch.watched() == 0
    assert rows(engine) == []
    second.dispose()

"""Each statement over a watched connection is checked before it runs, on every way SQLAlchemy
runs one, with no listener on the connection (:mod:`outbox.statement_watch`).

The first tests run the watch on a real SQLite database, without an outbox transaction; the
last one runs an outbox transaction (real broker, real database) and looks at the connection
the session used: no event listener of its own, since that listener made every statement take
SQLAlchemy's event path (docs/benchmarks.md, "A regression since 20261129T073342Z"), and its
COMMIT statement still refused.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.orm import sessionmaker

from outbox import OutboxProducer, TransactionStatementError, statement_watch
from tests.producer_fixtures import evidence_ids, order_ids, orders


class Refused(Exception):
    pass


@pytest.fixture
def sqlite(tmp_path: Path) -> Iterator[sa.Engine]:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'watch.db'}")
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (a INTEGER)")
    yield engine
    engine.dispose()


def refuse(seen: list[str], word: str) -> statement_watch.Check:
    def check(statement: str) -> None:
        seen.append(statement)
        if word in statement:
            raise Refused(statement)

    return check


def test_every_way_of_running_a_statement_is_checked(sqlite: sa.Engine) -> None:
    seen: list[str] = []
    with sqlite.connect() as conn:
        stop = statement_watch.watch(conn, refuse(seen, "DELETE"))
        conn.execute(sa.text("INSERT INTO t VALUES (:a)"), {"a": 1})  # do_execute
        conn.execute(sa.text("INSERT INTO t VALUES (:a)"), [{"a": 2}, {"a": 3}])  # executemany
        conn.exec_driver_sql("INSERT INTO t VALUES (4)")
        table = sa.table("t", sa.column("a"))  # insertmanyvalues: here two batches of one row
        inserted = conn.execution_options(insertmanyvalues_page_size=1).execute(
            table.insert().returning(table.c.a), [{"a": 5}, {"a": 6}]
        )
        assert sorted(inserted.scalars()) == [5, 6]
        conn.execution_options(no_parameters=True).exec_driver_sql("SELECT 1")  # no params
        with pytest.raises(Refused):
            conn.execute(sa.text("DELETE FROM t"))
        assert conn.execute(sa.text("SELECT count(*) FROM t")).scalar_one() == 6  # not run
        assert statement_watch.watched(conn)
        assert not conn._has_events  # no listener of its own: not SQLAlchemy's event path
        stop()
        assert not statement_watch.watched(conn)
        conn.execute(sa.text("DELETE FROM t"))  # no longer watched
    # each statement once (the executemany too), the refused one included, none after the stop
    assert seen == [
        "INSERT INTO t VALUES (?)",
        "INSERT INTO t VALUES (?)",
        "INSERT INTO t VALUES (4)",
        "INSERT INTO t (a) VALUES (?) RETURNING a",
        "INSERT INTO t (a) VALUES (?) RETURNING a",
        "SELECT 1",
        "DELETE FROM t",
        "SELECT count(*) FROM t",
    ]


def test_a_connection_not_watched_is_not_checked(sqlite: sa.Engine) -> None:
    seen: list[str] = []
    with sqlite.connect() as watched, sqlite.connect() as other:
        stop = statement_watch.watch(watched, refuse(seen, "DELETE"))
        try:
            other.execute(sa.text("DELETE FROM t"))
        finally:
            stop()
    assert seen == []


@pytest.mark.parametrize("first_stops_first", [True, False], ids=["in order", "reversed"])
def test_two_watches_of_one_connection_both_check_until_each_stops(
    sqlite: sa.Engine, first_stops_first: bool
) -> None:
    first: list[str] = []
    second: list[str] = []
    with sqlite.connect() as conn:
        stops = [
            statement_watch.watch(conn, refuse(first, "DELETE")),
            statement_watch.watch(conn, refuse(second, "UPDATE")),
        ]
        conn.execute(sa.text("SELECT 1"))
        stopped, staying = (stops, second) if first_stops_first else (stops[::-1], first)
        stopped[0]()  # one watch's stop (its transaction's end) leaves the other one
        with pytest.raises(Refused):
            conn.execute(sa.text("UPDATE t SET a = 1" if first_stops_first else "DELETE FROM t"))
        conn.execute(sa.text("DELETE FROM t" if first_stops_first else "UPDATE t SET a = 1"))
        stopped[1]()
        conn.execute(sa.text("UPDATE t SET a = 1"))
        conn.execute(sa.text("DELETE FROM t"))
        assert not statement_watch.watched(conn)
    assert len(staying) == 3, staying  # SELECT 1, the refused one, the other one
    assert len(first) + len(second) == 4


def test_the_same_check_watched_twice_is_stopped_once_per_stop(sqlite: sa.Engine) -> None:
    seen: list[str] = []
    check = refuse(seen, "DELETE")
    with sqlite.connect() as conn:
        stop_one = statement_watch.watch(conn, check)
        stop_two = statement_watch.watch(conn, check)
        stop_one()
        with pytest.raises(Refused):
            conn.execute(sa.text("DELETE FROM t"))
        stop_two()
        assert not statement_watch.watched(conn)


def test_a_do_execute_listener_that_runs_the_statement_itself_does_not_skip_the_check(
    sqlite: sa.Engine,
) -> None:
    # An application's own do_execute listener (tracing, a statement rewriter) may run the
    # statement and return True, which skips the dialect's execute: not the check
    ran: list[str] = []

    def run_it(cursor: Any, statement: str, parameters: Any, context: Any) -> bool:
        ran.append(statement)
        cursor.execute(statement, parameters)
        return True

    event.listen(sqlite, "do_execute", run_it)
    seen: list[str] = []
    with sqlite.connect() as conn:
        stop = statement_watch.watch(conn, refuse(seen, "DELETE"))
        try:
            conn.execute(sa.text("INSERT INTO t VALUES (1)"))
            with pytest.raises(Refused):
                conn.execute(sa.text("DELETE FROM t"))
        finally:
            stop()
    assert ran == ["INSERT INTO t VALUES (1)"]
    assert len(seen) == 2


RUN_IT_FIRST = """
@event.listens_for(Dialect, "do_execute")
def run_it(cursor, statement, parameters, context):
    cursor.execute(statement, parameters)
    return True

from outbox import statement_watch
"""
RUN_IT_AFTER = """
from outbox import statement_watch

@event.listens_for(Dialect, "do_execute", insert=True)
def run_it(cursor, statement, parameters, context):
    cursor.execute(statement, parameters)
    return True
"""


@pytest.mark.parametrize(
    ("registered", "by_listener"),
    [(RUN_IT_FIRST, True), (RUN_IT_AFTER, False)],
    ids=["before the outbox", "after it, insert=True"],
)
def test_a_class_level_listener_that_runs_the_statement_does_not_skip_the_check(
    tmp_path: Path, registered: str, by_listener: bool
) -> None:
    """A library that registers a class-level ``do_execute`` listener on ``Dialect`` before the
    outbox is imported comes first (SQLAlchemy appends them); one that runs the statement itself
    and returns True would skip the check, so the watch takes the slower listener path there.
    Registered after the outbox, even with ``insert=True``, it comes after the check (if a
    SQLAlchemy upgrade changes that, this fails rather than the check being skipped)."""
    script = f"""
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine.interfaces import Dialect
{registered}
class Refused(Exception):
    pass

def check(statement):
    if statement.startswith("DELETE"):
        raise Refused(statement)

engine = sa.create_engine("sqlite:///{tmp_path / "first.db"}")
with engine.connect() as conn:
    conn.exec_driver_sql("CREATE TABLE t (a INTEGER)")
    conn.execute(sa.text("INSERT INTO t VALUES (1)"))
    stop = statement_watch.watch(conn, check)
    print("by a listener", conn._has_events)
    try:
        conn.execute(sa.text("DELETE FROM t"))
    except Refused:
        print("refused", conn.execute(sa.text("SELECT count(*) FROM t")).scalar_one())
    stop()
    conn.execute(sa.text("DELETE FROM t"))
    print("after the stop", conn.execute(sa.text("SELECT count(*) FROM t")).scalar_one())
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stdout.split("\n")) == (
        0,
        [f"by a listener {by_listener}", "refused 1", "after the stop 0", ""],
    ), done.stderr


def test_a_statement_that_raised_is_reported_to_the_watch(sqlite: sa.Engine) -> None:
    """``failed`` hears of each statement that raised - the database's error or a check's
    refusal - and of no other; not once the watch stopped."""
    seen: list[str] = []
    failed: list[str] = []
    with sqlite.connect() as conn:
        assert statement_watch.reports_failures(conn)
        stop = statement_watch.watch(conn, refuse(seen, "DELETE"), failed.append)
        conn.execute(sa.text("SAVEPOINT a"))
        with pytest.raises(sa.exc.OperationalError):
            conn.execute(sa.text("SAVEPOINT a b"))  # a syntax error
        with pytest.raises(Refused):
            conn.execute(sa.text("DELETE FROM t"))
        assert failed == ["SAVEPOINT a b", "DELETE FROM t"]
        stop()
        with pytest.raises(sa.exc.OperationalError):
            conn.execute(sa.text("SAVEPOINT c d"))
        assert failed == ["SAVEPOINT a b", "DELETE FROM t"]
        assert not statement_watch.watched(conn)


def test_where_failures_go_unheard_the_watch_is_told(sqlite: sa.Engine, tmp_path: Path) -> None:
    """SQLAlchemy skips the error listeners for a connection with ``skip_user_error_events``,
    and a ``handle_error`` listener registered on ``Dialect`` before the outbox (in a process
    of its own here) runs first: one that raises ends the loop."""
    with sqlite.connect() as conn:
        quiet = conn.execution_options(skip_user_error_events=True)
        assert not statement_watch.reports_failures(quiet)
    script = f"""
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine.interfaces import Dialect

@event.listens_for(Dialect, "handle_error")
def translate(context):
    raise RuntimeError("translated")

from outbox import statement_watch

failed = []
engine = sa.create_engine("sqlite:///{tmp_path / "errors.db"}")
with engine.connect() as conn:
    stop = statement_watch.watch(conn, lambda statement: None, failed.append)
    try:
        conn.execute(sa.text("SAVEPOINT a b"))
    except RuntimeError:
        pass
    print(statement_watch.reports_failures(conn), failed)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stdout) == (0, "False []\n"), done.stderr


@pytest.mark.integration
def test_an_outbox_transaction_puts_no_listener_on_its_connection(
    producer: OutboxProducer, session_factory: sessionmaker, engine: sa.Engine
) -> None:
    order_id = f"watch-{uuid.uuid4().hex[:8]}"
    txn_ids: list[str] = []
    with pytest.raises(TransactionStatementError), producer.transaction(session_factory) as txn:
        txn_ids.append(txn.txn_id)
        assert txn.session is not None
        txn.session.execute(orders.insert().values(id=order_id, amount=1))
        txn.send("orders", order_id, key=order_id)
        conn = txn.session.connection()
        # Then the connection has no listener of its own: its statements do not take
        # SQLAlchemy's per-statement event path (which its _has_events turns on)
        assert not conn._has_events
        assert not conn.dispatch.before_cursor_execute
        assert statement_watch.watched(conn)
        # and its COMMIT statement is refused all the same
        txn.session.execute(sa.text("COMMIT"))
    assert not statement_watch.watched(conn)  # the watch ended with the transaction
    assert order_id not in order_ids(engine)
    assert txn_ids[0] not in evidence_ids(engine)

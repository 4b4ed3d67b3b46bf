"""Checking each statement over a watched connection before it runs, with no listener on the
connection.

An outbox transaction watches the connections its session begins database transactions on:
the evidence row's refuses statements that end the transaction
(:mod:`outbox.transaction_statements`), any other refuses writes
(:mod:`outbox.other_databases`). Both checks run here, in one class-level listener on the
``Dialect`` events ``do_execute``, ``do_execute_no_params`` and ``do_executemany``, registered
once at import. It looks the statement's connection up in a dictionary of watched connections
(empty for a statement no outbox transaction watches), and calls that connection's check.

Why not a ``before_cursor_execute`` listener on each connection (what the checks used before):
a Connection with a listener of its own takes SQLAlchemy's event path for every statement it
runs, and that path, not the listener's own work, cost the producer 0.12-0.18 of the protocol
floor's rate at 16 threads on PostgreSQL (docs/benchmarks.md, "A regression since
20261129T073342Z"). A dialect's ``do_execute`` events are one loop over the listeners, just
before the statement goes to the driver.

The listeners are class-level, so they run before any an application adds to its engine
(``event.listen(engine, "do_execute", ...)``): a listener of the application's that runs the
statement itself and returns True, which skips the dialect's execute, cannot skip the check too.
A class-level listener registered before this module was imported would run before them; where
one does, a connection is watched by a ``before_cursor_execute`` listener of its own as well,
the slower way that runs first whatever else listens (:func:`_first`). The connections are keyed
by the Connection object, held until the watch stops (when the outbox transaction ends, its
``finally`` run even by a left scope's finalisation): a Connection closed without its watch
stopping cannot hand its entry to a new one at the same address. (One difference a user may
see: SQLAlchemy's ``echo`` logs a statement before its ``do_execute`` listeners run, so a
refused statement is logged, then refused.) And since every dialect has a listener, every
statement of the process loops over the class's ``do_execute`` listeners (about 2 us on a slow
hour, docs/benchmarks.md): a dialect listener registered while other threads run statements
can meet SQLAlchemy's "deque mutated during iteration"; register them at start-up, as the outbox
does at import.

A statement that raised (the database refused it, or a check did) is reported to the watches
that asked (``failed``) by a class-level ``handle_error`` listener, which SQLAlchemy calls only
on an error: what a check noted before the statement ran (a savepoint begun) can be taken back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine.interfaces import Dialect, ExceptionContext

#: What a watch calls with each statement over its connection before it runs; it raises to
#: refuse the statement.
Check = Callable[[str], None]

#: The watched connections, each with its checks (a connection two watches share runs both):
#: one lookup per statement, only when some outbox transaction watches a connection.
_checks: dict[sa.Connection, tuple[Check, ...]] = {}
#: What a watch calls with each statement over its connection that raised instead of running
#: to its end (the database refused it, or a check did), by connection as :data:`_checks`.
_failures: dict[sa.Connection, tuple[Check, ...]] = {}
#: Serialises the changes to :data:`_checks` (once per transaction, never per statement).
_changing = threading.Lock()


def watch(
    connection: sa.Connection, check: Check, failed: Check | None = None
) -> Callable[[], None]:
    """Call ``check(statement)`` before each statement over ``connection`` runs, and
    ``failed(statement)`` after one that raised (a check's refusal included: what a check
    noted of a statement that never ran, or did not run to its end, may be taken back), until
    the function returned is called (it stops this watch only, not another of the
    connection). A statement run with SQLAlchemy's ``skip_user_error_events`` execution option
    is never reported failed."""
    with _changing:
        _checks[connection] = (*_checks.get(connection, ()), check)
        if failed is not None:
            _failures[connection] = (*_failures.get(connection, ()), failed)
    unlisten = None if _first(connection.dialect) else _listen(connection, check)

    def stop() -> None:
        with _changing:
            _remove(_checks, connection, check)
            if failed is not None:
                _remove(_failures, connection, failed)
        if unlisten is not None:
            unlisten()

    return stop


def _remove(table: dict[sa.Connection, tuple[Check, ...]], key: sa.Connection, it: Check) -> None:
    """``it`` from ``key``'s entry, once (another watch of the connection may hold the same)."""
    entries = list(table.get(key, ()))
    if it in entries:
        entries.remove(it)
    if entries:
        table[key] = tuple(entries)
    else:
        table.pop(key, None)


def reports_failures(connection: sa.Connection) -> bool:
    """Whether a statement over ``connection`` that raises now reaches a watch's ``failed``.
    Not where SQLAlchemy skips the error events: a dialect with its events off, a connection
    with the ``skip_user_error_events`` option; nor where a ``handle_error`` listener runs
    before this module's (one registered on ``Dialect`` before the import), since one that
    raises, SQLAlchemy's way of translating an error, ends the listeners' loop. (An error
    raised while SQLAlchemy handles another on the connection skips them too.) A watch that
    notes something before a statement runs notes it as if the statement may fail there."""
    dialect = connection.dialect
    if not dialect._has_events or connection.get_execution_options().get(
        "skip_user_error_events", False
    ):
        return False
    return next(iter(dialect.dispatch.handle_error), None) is _handle_error


def watched(connection: sa.Connection) -> bool:
    """Whether the statements over ``connection`` are checked now."""
    return connection in _checks


def _first(dialect: Dialect) -> bool:
    """Whether this module's listeners run first for ``dialect``. A class-level listener some
    library registered on ``Dialect`` (or a dialect class) before this module was imported runs
    before them (SQLAlchemy 2.1 appends class-level dialect listeners, ``insert=True`` or not);
    if it ran the statement itself and returned True, the check would never run. Asked at each
    watch (a microsecond), not cached, so a SQLAlchemy that honours ``insert=True`` some day
    cannot leave a stale answer."""
    if not dialect._has_events:  # a dialect that turned SQLAlchemy's events off for itself
        return False
    dispatch = dialect.dispatch
    return (
        next(iter(dispatch.do_execute), None) is _do_execute
        and next(iter(dispatch.do_execute_no_params), None) is _do_execute_no_params
        and next(iter(dispatch.do_executemany), None) is _do_executemany
    )


def _listen(connection: sa.Connection, check: Check) -> Callable[[], None]:
    """Where this module's listeners might not run: a ``before_cursor_execute`` listener on the
    connection too, which runs before any ``do_execute`` one (and costs each of its statements
    SQLAlchemy's event path); what stops it."""

    def before(conn: sa.Connection, cursor: Any, statement: str, *args: Any, **kw: Any) -> None:
        check(statement)

    event.listen(connection, "before_cursor_execute", before)
    return lambda: event.remove(connection, "before_cursor_execute", before)


# The listeners: SQLAlchemy passes the execution context on every path that runs a statement
# (single, executemany, no parameters, each insertmanyvalues batch, its own default and
# sequence executions); a None would name no connection.


@event.listens_for(Dialect, "do_execute")
def _do_execute(cursor: Any, statement: str, parameters: Any, context: Any) -> None:
    if _checks and context is not None:
        for check in _checks.get(context.root_connection, ()):
            check(statement)


@event.listens_for(Dialect, "do_execute_no_params")
def _do_execute_no_params(cursor: Any, statement: str, context: Any) -> None:
    if _checks and context is not None:
        for check in _checks.get(context.root_connection, ()):
            check(statement)


@event.listens_for(Dialect, "do_executemany")
def _do_executemany(cursor: Any, statement: str, parameters: Any, context: Any) -> None:
    if _checks and context is not None:
        for check in _checks.get(context.root_connection, ()):
            check(statement)


@event.listens_for(Dialect, "handle_error")
def _handle_error(context: ExceptionContext) -> None:
    # Called only when a statement raised (never on the statements' own path); a failed()
    # that raises would replace the statement's own error, so none does (they only forget).
    if _failures and context.connection is not None and context.statement is not None:
        for failed in _failures.get(context.connection, ()):
            failed(context.statement)

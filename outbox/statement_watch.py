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

The listeners are class-level, so they are the first ``do_execute`` listeners of every engine,
before any the application adds to its own (``event.listen(engine, "do_execute", ...)``): a
listener of the application's that runs the statement itself and returns True, which skips the
dialect's execute, cannot skip the check too. The connections are keyed by the Connection
object, held until the watch stops: a Connection closed without its watch stopping cannot hand
its entry to a new one at the same address.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine.interfaces import Dialect

#: What a watch calls with each statement over its connection before it runs; it raises to
#: refuse the statement.
Check = Callable[[str], None]

#: The watched connections, each with its check: one lookup per statement, only when some
#: outbox transaction watches a connection.
_checks: dict[sa.Connection, Check] = {}


def watch(connection: sa.Connection, check: Check) -> Callable[[], None]:
    """Call ``check(statement)`` before each statement over ``connection`` runs, until the
    function returned is called. A later watch of the same connection replaces this one, and
    this one's stop then leaves it in place."""
    _checks[connection] = check

    def stop() -> None:
        if _checks.get(connection) is check:
            del _checks[connection]

    return stop


def watched(connection: sa.Connection) -> bool:
    """Whether the statements over ``connection`` are checked now."""
    return connection in _checks


def _check(context: Any, statement: str) -> None:
    # context is None only on a few of SQLAlchemy's own executions (sequences and defaults,
    # never a transaction's end), which name no connection
    check = _checks.get(context.root_connection) if context is not None else None
    if check is not None:
        check(statement)


@event.listens_for(Dialect, "do_execute", insert=True)
def _do_execute(cursor: Any, statement: str, parameters: Any, context: Any) -> None:
    if _checks:
        _check(context, statement)


@event.listens_for(Dialect, "do_execute_no_params", insert=True)
def _do_execute_no_params(cursor: Any, statement: str, context: Any) -> None:
    if _checks:
        _check(context, statement)


@event.listens_for(Dialect, "do_executemany", insert=True)
def _do_executemany(cursor: Any, statement: str, parameters: Any, context: Any) -> None:
    if _checks:
        _check(context, statement)

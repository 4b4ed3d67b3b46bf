"""Checks on the statements one connection runs, for as long as an outbox transaction holds it.

The outbox refuses some statements before they reach the database: a write over a connection
that is not the evidence row's (:mod:`outbox.other_databases`) and a statement that ends the
evidence row's transaction (:mod:`outbox.transaction_statements`). Each such check belongs to one
connection for one outbox transaction, and is looked at on every statement of that connection.

SQLAlchemy's ``before_cursor_execute`` event is where a statement can still be stopped, but
listening on each connection and removing the listener again (``event.listen`` and
``event.remove`` keep registries of weak references) made a guarded session's transaction of
three statements on SQLite cost 210 us of CPU against 177 us this way (160 us unguarded;
medians of 7 rounds of 2,000). So each engine gets **one** listener, added
the first time an outbox transaction watches one of its connections and kept for the engine's
life, which looks the connection up in :data:`_CHECKS`: watching a connection is adding an entry
to a dictionary and removing it again. A statement of a connection no outbox transaction holds
(on an engine the outbox has seen) costs that one lookup.

The listener goes on ``connection.engine``: an engine made by ``execution_options()`` shares the
listeners of the engine it came from, so a connection of either is seen by one of them (by two
when both were hooked: the checks then run twice, which refuses nothing more).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

#: What a check is given: the connection and the statement about to run; it raises to refuse it.
Check = Callable[[sa.Connection, str], None]

#: The checks of each connection an outbox transaction holds now.
_CHECKS: dict[sa.Connection, list[Check]] = {}
#: Engines that have the listener.
_HOOKED: weakref.WeakSet[sa.Engine] = weakref.WeakSet()
_HOOKING = threading.Lock()


def watch(connection: sa.Connection, check: Check) -> Callable[[], None]:
    """Run ``check`` before each statement ``connection`` runs from now on; the function that
    stops it (call it once the outbox transaction ends)."""
    _hook(connection.engine)
    checks = _CHECKS.setdefault(connection, [])
    checks.append(check)

    def stop() -> None:
        with contextlib.suppress(ValueError):
            checks.remove(check)
        if not checks and _CHECKS.get(connection) is checks:
            del _CHECKS[connection]

    return stop


def watched() -> int:
    """How many connections have checks now (0 between outbox transactions)."""
    return len(_CHECKS)


def _hook(engine: sa.Engine) -> None:
    if engine in _HOOKED:
        return
    with _HOOKING:
        if engine not in _HOOKED:
            event.listen(engine, "before_cursor_execute", _before_cursor_execute)
            _HOOKED.add(engine)


def _before_cursor_execute(
    conn: sa.Connection, cursor: Any, statement: str, *args: Any, **kwargs: Any
) -> None:
    checks = _CHECKS.get(conn)
    if checks:
        for check in tuple(checks):
            check(conn, statement)

"""The connections a begun session holds, read from SQLAlchemy's private table of them.

SQLAlchemy 1.4-2.1 keeps, on each ``SessionTransaction``, a ``_connections`` table: each
connection (keyed by itself and by its engine) with its Core transaction, whether the session's
commit commits it and whether the session closes it. No public API says which connections a
session holds or whose transaction they are in; the outbox asks here, in one place, so that a
SQLAlchemy that renames the table changes one module (which then reads nothing).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import NestedTransaction
from sqlalchemy.orm import SessionTransaction


@dataclass(frozen=True)
class Held:
    """A connection a begun session holds."""

    connection: sa.Connection
    #: The session's commit would not commit its transaction: joined (``rollback_only``), or
    #: through a savepoint (``create_savepoint``, or ``control_fully`` inside one).
    external: bool
    #: The session checked it out itself (not the caller's own ``Connection``).
    checked_out: bool
    #: The Core transaction the session holds it in (None where none is known).
    transaction: Any = None


def held_connections(root: SessionTransaction) -> Iterator[Held]:
    """The connections a begun session's root transaction holds, each once (nothing when
    SQLAlchemy's table is gone)."""
    seen: set[int] = set()
    for entry in getattr(root, "_connections", {}).values():
        if id(entry[0]) not in seen:
            seen.add(id(entry[0]))
            yield held_entry(entry, root=True)


def held_entry(entry: tuple[Any, ...], root: bool) -> Held:
    """One ``_connections`` entry; ``root``: of the session's root transaction (a savepoint's
    entry holds a savepoint of its own, which joins nothing)."""
    connection, transaction, should_commit, closes = entry[0], entry[1], entry[2], entry[3]
    external = root and (not should_commit or isinstance(transaction, NestedTransaction))
    return Held(connection, external, bool(closes), transaction)


def held_by(scope: SessionTransaction, connection: sa.Connection) -> Held | None:
    """``connection`` as ``scope`` (the session's root transaction or a savepoint) holds it;
    None when it holds it not (or SQLAlchemy's table is gone)."""
    entry = getattr(scope, "_connections", {}).get(connection)  # keyed by connection too
    root = not scope.nested and scope.parent is None  # a savepoint's joins nothing
    return None if entry is None else held_entry(entry, root)

"""One database transaction per outbox transaction: the evidence row's, the only one whose
COMMIT the outbox makes its own.

The outbox writes its COMMIT op after the evidence row's database commits. A session can hold
several database transactions at once - ``Session(binds={...})`` with a second database, or a
second engine on the same one (``engine.execution_options(schema_translate_map=...)`` checks
out a connection of its own), or a horizontally sharded session
(``sqlalchemy.ext.horizontal_shard``) - and commits them one after another, in no fixed order,
each on its own. A write in another of them is not part of the outbox transaction: if its
COMMIT fails after the evidence row's succeeded, the messages announce writes that never
happened; if it succeeds and the evidence row's fails, the writes stay and their messages are
never delivered. So:

- a **sharded session** is refused as the transaction opens (:func:`refuse_sharded`): it routes
  every statement, the evidence INSERT included, to a shard of its choosing;
- a **statement that writes** over any other connection the session begins a transaction on
  is refused before it runs (the connection is watched from the session's ``after_begin``
  event until the outbox transaction ends, :mod:`outbox.statement_watch`):
  Core statements, the ORM's flushes (the COMMIT's own included, before any database commits)
  and statements run by the caller's own session events alike. Reads are fine. A statement
  counts as a read by its first keyword (``SELECT`` without ``INTO``, ``WITH`` without a
  data-modifying part, ``SHOW``, ``EXPLAIN`` without ``ANALYZE``, a savepoint, ``BEGIN``
  alone, ...: :func:`writes`); anything else counts as a write.

Not seen: writes before the outbox transaction began on a session the caller passes in already
begun (only its later statements are watched), statements run on the DBAPI connection itself,
and a function called by a ``SELECT`` that writes. A connection in autocommit mode has no
transaction to commit: what it runs is committed as it runs, outside the outbox transaction
whatever it is, and it is not watched. A session created with ``twophase=True`` prepares every
database before any commits, and is left alone.
"""

from __future__ import annotations

import re

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.horizontal_shard import ShardedSession
from sqlalchemy.orm import Session, SessionTransaction

from outbox import sql_texts, statement_watch, transaction_statements
from outbox.database_transaction import commits_each_statement
from outbox.errors import MultipleDatabasesError
from outbox.evidence import EVIDENCE_INSERT
from outbox.held_connections import held_connections
from outbox.session_guard import SessionGuard

#: First keywords of statements that read (or only steer the transaction).
_READS = frozenset(
    [
        "SELECT",
        "WITH",
        "SHOW",
        "EXPLAIN",
        "DESCRIBE",
        "DESC",
        "VALUES",
        "TABLE",
        "PRAGMA",
        "SET",
        "BEGIN",
        "START",
        "SAVEPOINT",
        "SAVE",
        "RELEASE",
        "ROLLBACK",
        "LOCK",
    ]
)
#: The first keyword, after blanks, parentheses and comments.
_FIRST_WORD = re.compile(sql_texts.LEADING + r"([A-Za-z]+)")
#: What makes a statement of a reading keyword write after all: a data-modifying part of a
#: ``WITH``, ``SELECT ... INTO`` (a new table), ``EXPLAIN ANALYZE`` (runs the statement).
_WRITES_INSIDE = {
    "WITH": re.compile(r"\b(?:INSERT|UPDATE|DELETE|MERGE)\b", re.I),
    "SELECT": re.compile(r"\bINTO\b", re.I),
    "EXPLAIN": re.compile(r"\bANALY[SZ]E\b", re.I),
}
#: Row locks, which read: ``... FOR UPDATE`` must not look like an ``UPDATE``.
_ROW_LOCK = re.compile(r"\bFOR\s+(?:NO\s+KEY\s+)?UPDATE\b", re.I)
#: ``BEGIN`` alone begins a transaction; ``BEGIN ... END`` is a procedural block.
_BEGIN_ALONE = re.compile(
    r"\s*BEGIN(?:\s+(?:TRANSACTION|TRAN|WORK|DEFERRED|IMMEDIATE|EXCLUSIVE))?\s*;?\s*", re.I
)


def refuse_sharded(session: Session) -> None:
    """Refuse a horizontally sharded session before the outbox transaction opens.

    Raises:
        MultipleDatabasesError: ``session`` is a ``ShardedSession``.
    """
    if isinstance(session, ShardedSession):
        raise MultipleDatabasesError(
            "an outbox transaction was given a horizontally sharded session (ShardedSession): "
            "it commits each shard's database on its own, so the outbox cannot make your "
            "writes and its messages one transaction. Run the outbox transaction on a session "
            "bound to the one shard's engine it writes, e.g. "
            "sessionmaker(bind=shards[shard_id])"
        )


def watch_held(session: Session, guard: SessionGuard) -> None:
    """Watch the connections a session the caller passes in, already begun, holds (its later
    statements; what it wrote before is not seen). Nothing to do for a session not begun."""
    root = session.get_transaction()
    if root is not None:
        for held in held_connections(root):
            _watch(session, guard, held.connection)


def writes(statement: str) -> bool:
    """Whether ``statement`` may write: anything but a read by its first keyword (and what
    that keyword's statement can hide: :data:`_WRITES_INSIDE`); for a text of several
    statements, any of them (:func:`~outbox.sql_texts.statements`)."""
    if ";" in statement:
        return any(_writes(part) for part in sql_texts.statements(statement))
    return _writes(statement)


def _writes(statement: str) -> bool:
    found = _FIRST_WORD.match(statement)
    if found is None:
        return True
    word = found.group(1).upper()
    if word not in _READS:
        return True
    if word == "BEGIN":
        return _BEGIN_ALONE.fullmatch(statement) is None
    inside = _WRITES_INSIDE.get(word)
    return inside is not None and inside.search(_ROW_LOCK.sub("", statement)) is not None


def _watch(session: Session, guard: SessionGuard, connection: sa.Connection) -> None:
    """Refuse writes over ``connection`` if it is not the evidence row's, and statements that
    end its transaction if it is (:mod:`outbox.transaction_statements`), from now until the
    outbox transaction ends."""
    if session.twophase or guard.watching(connection):
        return
    if commits_each_statement(connection):
        return
    if _is_evidence(session, guard, connection):
        guard.watch(connection, transaction_statements.watch(guard, connection))
        return

    def check(statement: str) -> None:
        if writes(statement):
            raise guard.refuse(
                MultipleDatabasesError(
                    f"transaction {guard.txn_id}: the session was about to write to "
                    f"{connection.engine.url.render_as_string(hide_password=True)} over a "
                    "connection other than the one the outbox's evidence row is in (a second "
                    "database, or a second engine on the same one); the two commit "
                    "separately, so the messages could announce writes that never commit, or "
                    "the writes stay with their messages never delivered. The statement did "
                    "not run; the transaction is refused and rolls back. Write one database "
                    "through one engine per outbox transaction: give the other writes a "
                    "session of their own, after the outbox transaction (reads elsewhere are "
                    f"fine). Refused: {statement[:80]!r}"
                )
            )

    guard.watch(connection, statement_watch.watch(connection, check))


def _is_evidence(session: Session, guard: SessionGuard, connection: sa.Connection) -> bool:
    """Whether ``connection`` is the one the evidence row is (or will be) inserted over: the
    session's bind for that INSERT, or a connection of it (True when the session has no bind
    for it: the INSERT will say what is wrong). The bind is asked for once per transaction, so
    a ``get_bind`` whose answer depends on the moment cannot make two connections both count
    as the evidence row's (a later answer that differs sends the INSERT over a watched one,
    which refuses it)."""
    bind = guard.evidence_bind
    if bind is None:
        try:
            bind = guard.evidence_bind = session.get_bind(clause=EVIDENCE_INSERT)
        except Exception:  # no bind for it, or a routing get_bind's own failure
            return True
    return connection is bind or connection.engine is bind


@event.listens_for(Session, "after_begin")
def _on_begin(session: Session, _scope: SessionTransaction, connection: sa.Connection) -> None:
    guard = SessionGuard.of(session)
    if guard is not None:
        _watch(session, guard, connection)

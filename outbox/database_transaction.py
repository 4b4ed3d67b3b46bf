"""The database transaction an outbox transaction needs: one of its own, which its COMMIT commits.

The outbox's guarantee rests on one database transaction holding the caller's writes and the
evidence row, committed only after every half record is acknowledged (then the COMMIT op is
written), or rolled back whole. Two ordinary SQLAlchemy set-ups give a session something else:

- **Autocommit.** ``create_engine(url, isolation_level="AUTOCOMMIT")``, an engine's or a
  connection's ``execution_options(isolation_level="AUTOCOMMIT")`` (often set for read-mostly
  code and shared with the rest of a service), or SQLite's driver with ``isolation_level=None``:
  every statement commits as it runs. A write before the code raises stays committed, and so
  does the evidence row, so a check answers COMMIT and the declined transaction's messages are
  delivered too (measured: both rows of a "write, send, write, raise" transaction in the
  database, and its message on the topic).
- **A transaction someone else owns.** A session bound to a ``Connection`` already in a
  transaction (SQLAlchemy's "joining a session into an external transaction", the usual test
  suite fixture and some unit-of-work code) does not commit it: its ``commit()`` leaves the
  connection's transaction to its owner (or releases a savepoint in it), who may roll it back
  after the COMMIT op was written - a message delivered for work the database never kept.

Both are refused when the session begins its database transaction on a connection
(SQLAlchemy's ``after_begin`` event: before the first statement runs, whoever issues it), and
as the scope opens for what can be seen then: a session bound to a connection already in a
transaction, or a session the caller passes in that already holds connections. A refusal is
raised again before the COMMIT, even if the caller caught it (:meth:`SessionGuard.refuse`),
and an autocommit connection is invalidated, so that no statement after a caught refusal
commits on its own. In a transaction that sends first, the first statement is the evidence
INSERT: that send's records are on the half topic, and the ROLLBACK op that follows the
refusal drops them (or a check, finding no evidence row, answers ROLLBACK).

No connection is checked out early: a caller may still choose the transaction's isolation
level with ``session.connection(execution_options=...)`` as its first call, which SQLAlchemy
ignores once the session has a connection. Which connections a begun session holds, and
whether it owns their transactions, only ``SessionTransaction._connections`` says (SQLAlchemy
1.4 to 2.1); without it, only the public checks run.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction

from outbox.errors import AutocommitSessionError, ExternalTransactionError
from outbox.evidence import EVIDENCE_INSERT
from outbox.held_connections import Held, held_by, held_connections
from outbox.session_guard import SessionGuard


def require_own_transaction(session: Session, guard: SessionGuard) -> None:
    """Refuse, as the outbox transaction opens and before the caller's code runs, what can be
    seen of ``session`` now; the rest is seen when it begins a transaction (:func:`_on_begin`).

    Raises:
        ExternalTransactionError: bound to a connection whose transaction it does not own.
        AutocommitSessionError: a connection it holds commits each statement on its own.
    """
    root = session.get_transaction()
    if root is not None:  # the caller's session, begun: the connections it holds
        for held in held_connections(root):
            _refuse(guard, session, held)
        return
    try:
        bind = session.get_bind()
    except sa.exc.UnboundExecutionError:  # binds per table or mapper: seen as they begin
        return
    if isinstance(bind, sa.Connection) and bind.in_transaction():
        fully = getattr(session, "join_transaction_mode", None) == "control_fully"
        external = not fully or bind.in_nested_transaction()
        _refuse(guard, session, Held(bind, external, checked_out=False))


def begin_unless_automatic(session: Session) -> None:
    """Begin ``session``'s transaction when it would not begin one itself
    (``Session(autobegin=False)``, or a ``sessionmaker`` made with it): the outbox transaction
    is that database transaction, and without it the caller's first statement and the evidence
    row fail ("Autobegin is disabled on this Session"). Called after the checks of
    :func:`require_own_transaction`, which read a begun session as one the caller began.
    No connection is checked out: beginning a session does not connect it."""
    if not session.in_transaction() and not getattr(session, "autobegin", True):
        session.begin()


def commits_each_statement(connection: sa.Connection) -> bool:
    """Whether ``connection``'s DBAPI connection is in autocommit mode, without a round trip.

    SQLite first: its driver has no transaction of its own when its ``isolation_level`` is
    None, unless one was begun by hand - SQLAlchemy's recipe for SQLite savepoints sends
    ``BEGIN`` from a ``begin`` event, so by ``after_begin`` it is in one (the dialect's own
    ``detect_autocommit_setting`` would call that recipe autocommit). Then the dialect's
    ``detect_autocommit_setting`` (SQLAlchemy 2.0.43 on: psycopg, asyncpg, MySQL's drivers,
    ...), or else the DBAPI's ``autocommit`` attribute (a method on MySQL's drivers).
    """
    dbapi: Any = connection.connection.dbapi_connection
    if connection.dialect.name == "sqlite":
        if getattr(dbapi, "autocommit", None) is True:  # sqlite3 from Python 3.12
            return True
        if getattr(dbapi, "isolation_level", "") is not None:
            return False
        driver: Any = connection.connection.driver_connection
        return getattr(driver, "in_transaction", None) is False
    detect = getattr(connection.dialect, "detect_autocommit_setting", None)
    if detect is not None:
        try:
            return bool(detect(dbapi))
        except Exception:  # NotImplementedError, or a third-party dialect's own failure
            pass
    autocommit = getattr(dbapi, "autocommit", None)
    if callable(autocommit):  # MySQLdb, PyMySQL: autocommit(on) sets it
        getter = getattr(dbapi, "get_autocommit", None)
        return bool(getter()) if callable(getter) else False
    return autocommit is True


def _refuse(guard: SessionGuard, session: Session, held: Held) -> None:
    connection = held.connection
    if held.external:
        raise guard.refuse(
            ExternalTransactionError(
                f"transaction {guard.txn_id}: the session is bound to a Connection in a "
                "transaction it does not own (or joined it with a savepoint), so its commit "
                "would not commit the database and the outbox would announce work the "
                "transaction's owner may still roll back; the outbox transaction is refused "
                "and rolls back. Bind the session to the engine. (A session created with "
                "join_transaction_mode='control_fully' on a connection outside any savepoint "
                "is given that transaction, and the outbox commits it.)"
            )
        )
    if commits_each_statement(connection) and _holds_evidence(session, connection):
        if held.checked_out:  # the session's own: no later statement commits on its own if caught
            connection.invalidate()
        raise guard.refuse(
            AutocommitSessionError(
                f"transaction {guard.txn_id}: the session's connection commits each statement "
                "on its own (isolation_level='AUTOCOMMIT' on the engine, its execution_options "
                "or the connection's, or SQLite's driver with isolation_level=None), so the "
                "outbox cannot make your writes and its messages one transaction; it refused "
                "before the transaction's first statement ran (a message already sent is "
                "rolled back, never delivered). Give outbox transactions an engine without "
                "AUTOCOMMIT: e.g. engine.execution_options(isolation_level='READ COMMITTED') on "
                "PostgreSQL, 'SERIALIZABLE' on SQLite"
            )
        )


def _holds_evidence(session: Session, connection: sa.Connection) -> bool:
    """Whether ``connection`` is to the database the evidence row goes to: a session with
    several binds may read from an autocommit replica, which the guarantee does not cover (only
    writes in the evidence row's database commit with it)."""
    try:
        bind = session.get_bind(clause=EVIDENCE_INSERT)
    except Exception:  # no bind for it (the INSERT will say so), or a routing get_bind's own
        return True
    return bind.engine.pool is connection.engine.pool


@event.listens_for(Session, "after_begin")
def _on_begin(session: Session, scope: SessionTransaction, connection: sa.Connection) -> None:
    """A session an outbox transaction runs on began a transaction (or a savepoint) on
    ``connection``, before its first statement: refuse autocommit, and for the session's root
    transaction one it does not own."""
    guard = SessionGuard.of(session)
    if guard is None:
        return
    _refuse(guard, session, held_by(scope, connection) or Held(connection, False, False))

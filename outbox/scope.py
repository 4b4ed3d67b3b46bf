"""``producer.transaction(session)``: one local database transaction with its messages, in a
``with`` block (a SQLAlchemy ``Session``) or an ``async with`` block (an ``AsyncSession``).

Both ways run the same steps: join an enclosing transaction or open one; guard the session
(:mod:`outbox.session_guard`); the evidence row with the first half send; on a
normal exit the database COMMIT, then the COMMIT op; on an exception the database ROLLBACK, then
the ROLLBACK op; when the COMMIT itself fails, no op (the outcome may be unknown) and the
session's connections are closed, leaving the answer to the checker and the evidence row
(:mod:`outbox.commit_failure`). The asyncio way (:mod:`outbox.async_scope`) awaits where
the other waits, so the event loop never blocks; nesting and the session's form are decided
in :mod:`outbox.nesting`, and what becomes of a statement left without its exit (a signal
handler's exception as the exit began) in :mod:`outbox.left_scopes`.

The session says which way applies. Handing a ``Session`` to ``async with``, or an
``AsyncSession`` to ``with``, fails at once, naming the right form.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import Token
from types import TracebackType
from typing import Any

from sqlalchemy.orm import Session

from outbox import tracing
from outbox.async_scope import run_async
from outbox.async_transaction import AsyncOutboxTransaction
from outbox.commit_failure import commit_failed, discard_connections
from outbox.database_transaction import begin_unless_automatic, require_own_transaction
from outbox.errors import ConfigurationError, WrongFormError
from outbox.evidence import write_evidence, write_while_sending
from outbox.left_scopes import Statement, StatementExit, end_left, opened_by, statement_of
from outbox.logs import fields
from outbox.nesting import (
    SessionSource,
    current,
    described,
    is_async_session,
    is_sync_session,
    joined,
    opened,
    reset,
    resolved,
)
from outbox.other_databases import refuse_sharded, watch_held
from outbox.protocol.states import LocalTransactionState
from outbox.session_guard import SessionGuard, may_send
from outbox.transaction import OutboxTransaction, TransactionHost
from outbox.witnesses import witness_commit

log = logging.getLogger("outbox")


class TransactionScope:
    """What ``producer.transaction(session)`` returns: enter it with ``with`` for a ``Session``
    (or a ``sessionmaker``), with ``async with`` for an ``AsyncSession`` (or an
    ``async_sessionmaker``); it yields the transaction."""

    def __init__(self, producer: TransactionHost, session: Any) -> None:
        self.producer = producer
        self.session = session
        self.looked_up: weakref.ref[Any] | None = None  # the last exit looked up: left_scopes
        self._sync: Any = None
        self._async: Any = None

    def __enter__(self) -> OutboxTransaction:
        self._entered()
        session = resolved(self.session)  # a scoped session names this thread's session
        if is_async_session(session):
            raise WrongFormError(
                f"producer.transaction() was given {described(session)} in a `with` block; an "
                "AsyncSession runs in the asyncio form: `async with producer.transaction("
                "session) as txn:` and `await txn.send(...)`"
            )
        statement = statement_of(self)
        self._sync = run_sync(self.producer, session, statement)
        statement.generator = weakref.ref(self._sync.gen)
        txn: OutboxTransaction = self._sync.__enter__()
        return txn

    def _exit(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        result: bool | None = self._sync.__exit__(exc_type, exc, tb)
        return result

    __exit__ = StatementExit(_exit)

    async def __aenter__(self) -> AsyncOutboxTransaction:
        self._entered()
        session = resolved(self.session)  # a scoped session names this task's session
        if is_sync_session(session):
            raise WrongFormError(
                f"producer.transaction() was given {described(session)} in an `async with` "
                "block; a synchronous Session runs in `with producer.transaction(session) as "
                "txn:` (or use an AsyncSession from sqlalchemy.ext.asyncio)"
            )
        statement = statement_of(self)
        statement.loop = weakref.ref(asyncio.get_running_loop())
        self._async = run_async(self.producer, session, statement)
        statement.generator = weakref.ref(self._async.gen)
        txn: AsyncOutboxTransaction = await self._async.__aenter__()
        return txn

    async def _aexit(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        result: bool | None = await self._async.__aexit__(exc_type, exc, tb)
        return result

    __aexit__ = StatementExit(_aexit)

    def _entered(self) -> None:
        if self._sync is not None or self._async is not None:
            raise ConfigurationError(
                "a producer.transaction(...) scope is entered once; call "
                "producer.transaction() again for another transaction"
            )


@contextmanager
def run_sync(
    producer: TransactionHost, session: SessionSource, statement: Statement | None = None
) -> Iterator[OutboxTransaction]:
    """The transaction of a ``with`` statement; ``statement`` is what it knows of the
    statement, so that a later one never joins it once the statement is left, and ends it
    (:mod:`outbox.left_scopes`)."""
    end_left(current.get())
    outer = joined(OutboxTransaction, Session, session, "synchronous", producer)
    if outer is not None:
        yield outer
        return
    db, own = opened(Session, session, "a `with` block needs a SQLAlchemy Session or sessionmaker")
    refuse_sharded(db)
    txn = OutboxTransaction(
        producer, on_sent=_on_sent(db), may_send=may_send(db), in_flight=write_while_sending(db)
    )
    txn.session = db
    if statement is not None:
        opened_by(txn, statement)
    commit_began = discarded = False
    # Set up inside the try, so that an exception raised just after (a signal handler's) still
    # ends this transaction: left current and unended in the caller's context, it would be
    # joined by every later transaction there, which would then never commit.
    guard: SessionGuard | None = None
    token: Token[Any] | None = None
    try:
        guard = SessionGuard.attach(db, txn.txn_id)
        token = current.set(txn)
        require_own_transaction(db, guard)
        watch_held(db, guard)
        begin_unless_automatic(db)
        yield txn
        txn.committing()  # no COMMIT before every half record is acknowledged
        txn.check_whole()
        guard.check()
        guard.committing()
        # From here an exception may follow a database COMMIT that happened: one raised by a
        # signal handler (Ctrl-C, a worker's timeout, a task's time limit) between the COMMIT's
        # return and the outcome's record must not roll back, so it leaves the outcome UNKNOWN.
        commit_began = True
        try:
            if tracing.otel is None:
                db.commit()
            else:
                tracing.otel.commit(txn, db.commit)
        except BaseException as err:
            if guard.never_committed(err):  # a refusal, a failed flush: nothing committed
                commit_began = False
            else:
                commit_failed(txn)
                discard_connections(db.invalidate, txn.txn_id)
                discarded = True
            raise
        if txn.partition is not None:  # its evidence row committed
            witness_commit(producer.witnesses, db, txn.txn_id)
        txn.finish(LocalTransactionState.COMMIT)
    except BaseException as err:
        if commit_began and txn.state in (None, LocalTransactionState.UNKNOWN):
            # Interrupted after the COMMIT returned, or while a failed one was handled: the
            # checker decides, and the session's connections go whatever they hold (SQLite
            # keeps a refused COMMIT's transaction open, write lock and all).
            if txn.state is None:
                commit_failed(txn, f"was interrupted ({type(err).__name__}) once it began")
            if not discarded:
                discard_connections(db.invalidate, txn.txn_id)
        elif txn.state is None and guard is not None and guard.ended_under_it():
            # Committed or rolled back through its connection: which, the evidence row tells
            # the checker; what ran after, in a transaction the session does not know, goes.
            # Records still travelling are awaited (retried) first: they may have committed.
            try:
                with contextlib.suppress(Exception):
                    txn.settle()
            finally:
                commit_failed(txn, "was made or undone through the session's connection")
                discard_connections(db.invalidate, txn.txn_id)
        elif txn.state is None:
            try:
                db.rollback()
            except Exception:
                # The DB did not commit either way; the ROLLBACK op below is still the truth.
                log.exception(
                    "DB rollback of transaction %s failed",
                    txn.txn_id,
                    extra=fields(txn_id=txn.txn_id),
                )
            txn.finish(LocalTransactionState.ROLLBACK)
        raise
    finally:
        if token is not None:
            reset(token)
        if guard is not None:
            guard.detach()
        if own:
            db.close()


def _on_sent(db: Session) -> Callable[[OutboxTransaction, bool], None]:
    """After each half send: the evidence row with the first, then the scopes to watch."""

    def sent(txn: OutboxTransaction, first: bool) -> None:
        if first:
            write_evidence(db, txn.txn_id, txn.producer.settings.producer_group)
        guard = SessionGuard.of(db)
        if guard is not None:
            guard.sent()

    return sent

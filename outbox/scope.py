"""``producer.transaction(session)``: one local database transaction with its messages, in a
``with`` block (a SQLAlchemy ``Session``) or an ``async with`` block (an ``AsyncSession``).

Both ways run the same steps: join an enclosing transaction or open one; guard the session
(:mod:`outbox.session_guard`); the evidence row with the first half send; on a
normal exit the database COMMIT, then the COMMIT op; on an exception the database ROLLBACK, then
the ROLLBACK op; when the COMMIT itself fails, no op (the outcome may be unknown) and the
session's connections are closed, leaving the answer to the checker and the evidence row. The
asyncio way awaits where the other waits, so the event loop never blocks.

The session says which way applies. Handing a ``Session`` to ``async with``, or an
``AsyncSession`` to ``with``, fails at once, naming the right form.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy.orm import Session, sessionmaker

from outbox import tracing
from outbox.async_transaction import AsyncOutboxTransaction
from outbox.errors import ConfigurationError, WrongFormError
from outbox.evidence import write_evidence, write_while_sending
from outbox.logs import fields
from outbox.protocol.states import LocalTransactionState
from outbox.session_guard import SessionGuard
from outbox.transaction import OutboxTransaction, TransactionHost

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

log = logging.getLogger("outbox")

T = TypeVar("T", OutboxTransaction, AsyncOutboxTransaction)
S = TypeVar("S")

SessionSource = Session | Callable[[], Session]

#: The transaction the current thread or task is inside, for ``outbox.send()`` and nesting.
current: ContextVar[OutboxTransaction | AsyncOutboxTransaction | None] = ContextVar(
    "outbox_transaction", default=None
)


def is_async_session(session: object) -> bool:
    """An ``AsyncSession``, or a factory known to make them (``async_sessionmaker``)."""
    try:
        from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
    except ImportError:  # pragma: no cover - SQLAlchemy always ships it; greenlet may not be
        return False
    return isinstance(session, AsyncSession | async_sessionmaker)


def is_sync_session(session: object) -> bool:
    """A ``Session``, or a factory known to make them (``sessionmaker``)."""
    return isinstance(session, Session | sessionmaker)


class TransactionScope:
    """What ``producer.transaction(session)`` returns: enter it with ``with`` for a ``Session``
    (or a ``sessionmaker``), with ``async with`` for an ``AsyncSession`` (or an
    ``async_sessionmaker``); it yields the transaction."""

    def __init__(self, producer: TransactionHost, session: Any) -> None:
        self.producer = producer
        self.session = session
        self._sync: Any = None
        self._async: Any = None

    def __enter__(self) -> OutboxTransaction:
        self._entered()
        if is_async_session(self.session):
            raise WrongFormError(
                f"producer.transaction() was given {_what(self.session)} in a `with` block; an "
                "AsyncSession runs in the asyncio form: `async with producer.transaction("
                "session) as txn:` and `await txn.send(...)`"
            )
        self._sync = run_sync(self.producer, self.session)
        txn: OutboxTransaction = self._sync.__enter__()
        return txn

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        result: bool | None = self._sync.__exit__(exc_type, exc, tb)
        return result

    async def __aenter__(self) -> AsyncOutboxTransaction:
        self._entered()
        if is_sync_session(self.session):
            raise WrongFormError(
                f"producer.transaction() was given {_what(self.session)} in an `async with` "
                "block; a synchronous Session runs in `with producer.transaction(session) as "
                "txn:` (or use an AsyncSession from sqlalchemy.ext.asyncio)"
            )
        self._async = run_async(self.producer, self.session)
        txn: AsyncOutboxTransaction = await self._async.__aenter__()
        return txn

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        result: bool | None = await self._async.__aexit__(exc_type, exc, tb)
        return result

    def _entered(self) -> None:
        if self._sync is not None or self._async is not None:
            raise ConfigurationError(
                "a producer.transaction(...) scope is entered once; call "
                "producer.transaction() again for another transaction"
            )


def _what(session: object) -> str:
    return f"a {type(session).__module__}.{type(session).__qualname__}"


def _joined(form: type[T], session_type: type, session: object, name: str) -> T | None:
    """The enclosing transaction a nested one joins (None: there is none).

    Raises:
        WrongFormError: the enclosing one is of the other form.
        ConfigurationError: the nested one was given another session than it.
    """
    outer = current.get()
    if outer is None or outer.state is not None:
        return None  # none, or one that ended (inherited by a task it left running)
    if not isinstance(outer, form):
        raise WrongFormError(
            f"an {name} outbox transaction was opened inside the transaction {outer.txn_id} of "
            "the other form; nest transactions of one form (a synchronous one cannot await, an "
            "asyncio one cannot run in a synchronous block)"
        )
    if isinstance(session, session_type) and session is not getattr(outer, "session", None):
        raise ConfigurationError(_other_session(outer.txn_id))
    return outer


def _opened(session_type: type[S], session: Any, needs: str) -> tuple[S, bool]:
    """The session to run in, and whether the outbox made it (and closes it).

    Raises:
        WrongFormError: ``session`` is (or made) something else, naming the form that fits.
    """
    own = not isinstance(session, session_type)
    db = session() if callable(session) and own else session
    if not isinstance(db, session_type):
        if isinstance(db, Session):
            db.close()  # made for the wrong form; an AsyncSession holds nothing yet
        fits = (
            "; an AsyncSession runs in `async with`"
            if is_async_session(db)
            else "; a synchronous Session runs in `with`"
            if is_sync_session(db)
            else ""
        )
        raise WrongFormError(f"producer.transaction() in {needs}, got {db!r}{fits}")
    return db, own


# -- the synchronous way ---------------------------------------------------------------------


@contextmanager
def run_sync(producer: TransactionHost, session: SessionSource) -> Iterator[OutboxTransaction]:
    outer = _joined(OutboxTransaction, Session, session, "synchronous")
    if outer is not None:
        yield outer
        return
    db, own = _opened(Session, session, "a `with` block needs a SQLAlchemy Session or sessionmaker")
    txn = OutboxTransaction(producer, on_sent=_on_sent(db), in_flight=write_while_sending(db))
    txn.session = db
    guard = SessionGuard.attach(db, txn.txn_id)
    token = current.set(txn)
    try:
        yield txn
        txn.check_whole()
        guard.check()
        guard.committing()
        try:
            if tracing.otel is None:
                db.commit()
            else:
                tracing.otel.commit(txn, db.commit)
        except BaseException:
            _commit_failed(txn)
            _discard_connections(db.invalidate, txn.txn_id)
            raise
        txn.finish(LocalTransactionState.COMMIT)
    except BaseException:
        if txn.state is None:
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
        guard.detach()
        current.reset(token)
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


# -- the asyncio way -------------------------------------------------------------------------


@asynccontextmanager
async def run_async(
    producer: TransactionHost, session: Any
) -> AsyncIterator[AsyncOutboxTransaction]:
    from sqlalchemy.ext.asyncio import AsyncSession

    outer = _joined(AsyncOutboxTransaction, AsyncSession, session, "asyncio")
    if outer is not None:
        yield outer
        return
    db, own = _opened(
        AsyncSession, session, "an `async with` block needs an AsyncSession or async_sessionmaker"
    )
    if producer.known_partitions is None:  # read once per producer: a blocking request
        await asyncio.to_thread(lambda: producer.partitions)
    txn = AsyncOutboxTransaction(
        producer, on_sent=_on_sent_async(db), in_flight=write_while_sending(db.sync_session)
    )
    txn.session = db
    guard = SessionGuard.attach(db.sync_session, txn.txn_id)
    token = current.set(txn)
    try:
        yield txn
        await txn.close()
        txn.check_awaited()
        guard.check()
        guard.committing()
        try:
            if tracing.otel is None:
                await db.commit()
            else:
                await tracing.otel.commit_async(txn.core, db.commit)
        except BaseException:
            _commit_failed(txn.core)
            await _discard_async(db, txn.txn_id)
            raise
        await txn.finish(LocalTransactionState.COMMIT)
    except BaseException:
        if txn.state is None:
            try:
                await txn.close()  # a send under way lands in what is rolled back
                await db.rollback()
            except Exception:
                log.exception(
                    "DB rollback of transaction %s failed",
                    txn.txn_id,
                    extra=fields(txn_id=txn.txn_id),
                )
            await txn.finish(LocalTransactionState.ROLLBACK)
        raise
    finally:
        guard.detach()
        current.reset(token)
        if own:
            await db.close()


def _on_sent_async(db: AsyncSession) -> Callable[[OutboxTransaction, bool], Any]:
    async def sent(txn: OutboxTransaction, first: bool) -> None:
        if first:
            group = txn.producer.settings.producer_group
            await db.run_sync(write_evidence, txn.txn_id, group)
        guard = SessionGuard.of(db.sync_session)
        if guard is not None:
            guard.sent()

    return sent


async def _discard_async(db: AsyncSession, txn_id: str) -> None:
    try:
        await db.invalidate()
    except Exception:
        log.exception(
            "closing the connections of transaction %s failed",
            txn_id,
            extra=fields(txn_id=txn_id),
        )


# -- shared ----------------------------------------------------------------------------------


def _other_session(txn_id: str) -> str:
    return (
        f"a nested outbox transaction was given another session than the transaction {txn_id} "
        "it joins: its writes would commit apart from the outer transaction's messages; pass "
        "the outer session, or none"
    )


def _commit_failed(txn: OutboxTransaction) -> None:
    txn.state = LocalTransactionState.UNKNOWN
    log.warning(
        "DB commit of transaction %s failed; leaving it to the checker",
        txn.txn_id,
        extra=fields(txn_id=txn.txn_id, partition=txn.partition, offsets=txn.offsets),
    )


def _discard_connections(invalidate: Callable[[], None], txn_id: str) -> None:
    """Close the connections of a session whose COMMIT failed, whatever they still hold.

    SQLite keeps the transaction open, with its write lock, when a deferred constraint fails
    at COMMIT, and SQLAlchemy, counting the transaction as ended, returns the connection to
    its pool without a rollback: every later writer, the check's fence included, would wait
    for that lock, and the check would answer UNKNOWN until the transaction is given up.
    """
    try:
        invalidate()
    except Exception:
        log.exception(
            "closing the connections of transaction %s failed",
            txn_id,
            extra=fields(txn_id=txn_id),
        )

"""``async with producer.transaction(session)``: the scope's steps for an ``AsyncSession``.

The same steps as the synchronous way (:mod:`outbox.scope`), awaited where that one waits, so
the event loop never blocks: join or open, guard the session, the evidence row with the first
half send, COMMIT then the COMMIT op, or ROLLBACK then the ROLLBACK op.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from contextvars import Token
from typing import TYPE_CHECKING, Any

from outbox import tracing
from outbox.async_transaction import AsyncOutboxTransaction
from outbox.commit_failure import commit_failed, discard_connections_async
from outbox.database_transaction import begin_unless_automatic, require_own_transaction
from outbox.evidence import write_evidence, write_while_sending
from outbox.left_scopes import Statement, end_left_async, opened_by
from outbox.logs import fields
from outbox.nesting import current, joined, opened, reset
from outbox.other_databases import refuse_sharded, watch_held
from outbox.protocol.states import LocalTransactionState
from outbox.session_guard import SessionGuard, may_send
from outbox.transaction import OutboxTransaction, TransactionHost
from outbox.witnesses import witness_commit

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

log = logging.getLogger("outbox")


@asynccontextmanager
async def run_async(
    producer: TransactionHost, session: Any, statement: Statement | None = None
) -> AsyncIterator[AsyncOutboxTransaction]:
    """The transaction of an ``async with`` statement (``statement``: as in ``run_sync``)."""
    from sqlalchemy.ext.asyncio import AsyncSession

    await end_left_async(current.get())
    outer = joined(AsyncOutboxTransaction, AsyncSession, session, "asyncio", producer)
    if outer is not None:
        yield outer
        return
    db, own = opened(
        AsyncSession, session, "an `async with` block needs an AsyncSession or async_sessionmaker"
    )
    refuse_sharded(db.sync_session)
    if producer.known_partitions is None:  # read once per producer: a blocking request
        await asyncio.to_thread(lambda: producer.partitions)
    txn = AsyncOutboxTransaction(
        producer,
        on_sent=_on_sent_async(db),
        may_send=may_send(db.sync_session),
        in_flight=write_while_sending(db.sync_session),
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
        guard = SessionGuard.attach(db.sync_session, txn.txn_id)
        token = current.set(txn)
        if db.in_transaction():  # the caller's, begun: a refusal invalidates a connection (IO)
            await db.run_sync(require_own_transaction, guard)
        else:
            require_own_transaction(db.sync_session, guard)
        watch_held(db.sync_session, guard)
        begin_unless_automatic(db.sync_session)
        yield txn
        await txn.close()
        txn.check_awaited()
        guard.check()
        guard.committing()
        commit_began = True  # an exception from here on may follow a COMMIT: see run_sync
        try:
            if tracing.otel is None:
                await db.commit()
            else:
                await tracing.otel.commit_async(txn.core, db.commit)
        except BaseException as err:
            if guard.never_committed(err):  # a refusal, a failed flush: nothing committed
                commit_began = False
            else:
                commit_failed(txn.core)
                await discard_connections_async(db, txn.txn_id)
                discarded = True
            raise
        if txn.core.partition is not None:  # its evidence row committed
            witness_commit(producer.witnesses, db.sync_session, txn.txn_id)
        await txn.finish(LocalTransactionState.COMMIT)
    except BaseException as err:
        if commit_began and txn.state in (None, LocalTransactionState.UNKNOWN):
            # Interrupted after the COMMIT returned, or while a failed one was handled: the
            # checker decides, and the session's connections go whatever they hold (SQLite
            # keeps a refused COMMIT's transaction open, write lock and all).
            if txn.state is None:
                commit_failed(txn.core, f"was interrupted ({type(err).__name__}) once it began")
            if not discarded:
                await discard_connections_async(db, txn.txn_id)
        elif txn.state is None and guard is not None and guard.ended_under_it():
            try:
                await txn.close()  # a send under way: its records are the checker's to decide
            finally:
                commit_failed(txn.core, "was made or undone through the session's connection")
                await discard_connections_async(db, txn.txn_id)
        elif txn.state is None:
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
        if token is not None:
            reset(token)
        if guard is not None:
            guard.detach()
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

"""When the database COMMIT itself fails: the outcome is unknown, so no op is sent.

The transaction is marked UNKNOWN for the checker (its evidence row, committed or not, answers
the check), and the session's connections are closed whatever they still hold.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from outbox.logs import fields
from outbox.protocol.states import LocalTransactionState
from outbox.transaction import OutboxTransaction

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

log = logging.getLogger("outbox")


def commit_failed(txn: OutboxTransaction, what: str = "failed") -> None:
    """Mark ``txn`` UNKNOWN: neither op is sent, the checker asks and the evidence row answers."""
    txn.state = LocalTransactionState.UNKNOWN
    log.warning(
        "DB commit of transaction %s %s; leaving it to the checker",
        txn.txn_id,
        what,
        extra=fields(txn_id=txn.txn_id, partition=txn.partition, offsets=txn.offsets),
    )


def discard_connections(invalidate: Callable[[], None], txn_id: str) -> None:
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


async def discard_connections_async(db: AsyncSession, txn_id: str) -> None:
    """:func:`discard_connections` for an ``AsyncSession``."""
    try:
        await db.invalidate()
    except Exception:
        log.exception(
            "closing the connections of transaction %s failed",
            txn_id,
            extra=fields(txn_id=txn_id),
        )

"""The evidence row: proof, inside the producer's own database, that a transaction committed.

The table is created by the shipped Alembic migration (``outbox.migrations``). The producer
writes ``kind='evidence'`` with its first half send, inside the local transaction (while the
records travel to Kafka where the database locks rows: :func:`write_while_sending`); the check
endpoint writes ``kind='fence'`` for a transaction id it finds no evidence for, which makes a
later commit of that transaction fail on the primary key.
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.orm import Session

from outbox.errors import TransactionFencedError

metadata = sa.MetaData()

#: Mirrors migration ``outbox_0001``; the migration, not this object, creates the table.
evidence_table = sa.Table(
    "outbox_evidence",
    metadata,
    sa.Column("txn_id", sa.String(36), primary_key=True),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("producer_group", sa.String(249), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)

#: Mirrors migration ``outbox_0002``: one row, the pruning horizon (see :mod:`outbox.pruning`).
horizon_table = sa.Table(
    "outbox_evidence_horizon",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("pruned_before_ms", sa.BigInteger, nullable=False),
)

EVIDENCE = "evidence"
FENCE = "fence"
#: The producer's INSERT of its evidence row; also what a session's bind for it is asked with.
EVIDENCE_INSERT = evidence_table.insert()


def write_evidence(session: Session, txn_id: str, producer_group: str) -> None:
    """Insert the evidence row in the session's current transaction.

    Raises:
        TransactionFencedError: a check already fenced this transaction id; the caller must
            roll back (the outbox's transaction wrappers do).
    """
    row = {
        "txn_id": txn_id,
        "kind": EVIDENCE,
        "producer_group": producer_group,
        "created_at": dt.datetime.now(dt.UTC),
    }
    try:
        session.execute(EVIDENCE_INSERT, row)  # one row: not the executemany path
    except sa.exc.IntegrityError as err:
        raise TransactionFencedError(
            f"transaction {txn_id} was fenced by a check (it answered ROLLBACK while this "
            "transaction had not yet written its evidence); it is rolled back and its messages "
            "will never be delivered - retry the business operation as a new transaction"
        ) from err


def write_while_sending(session: Session) -> bool:
    """Whether the evidence row may be inserted while the first send's records travel to Kafka.

    On a database that locks rows (PostgreSQL, MySQL, ...) the INSERT locks a fresh key nobody
    else writes, so it costs others nothing to take it a Kafka round trip earlier, and the two
    round trips overlap. SQLite has one writer: its first INSERT takes the database's write
    lock until COMMIT, so holding it for Kafka's round trip would make every other writer wait
    too; there the row waits for the acknowledgement.
    """
    try:
        return session.get_bind().dialect.name != "sqlite"
    except sa.exc.UnboundExecutionError:  # the INSERT says what is wrong, later
        return False

"""Answering a check: COMMIT, ROLLBACK or UNKNOWN for each transaction id.

The default, :class:`FencedResolver`, never answers ROLLBACK for a transaction that can still
commit. It looks for the evidence row the transaction wrote; when there is none it inserts a
*fence* row under the same key. If that insert succeeds, the transaction cannot commit any more
(its own evidence insert would fail), so ROLLBACK is the truth. If the transaction still holds
its row (PostgreSQL: an uncommitted insert of the same key; SQLite: the write lock), the insert
waits at most ``lock_timeout_s`` and the answer is UNKNOWN.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

import sqlalchemy as sa

from outbox.evidence import EVIDENCE, FENCE, evidence_table
from outbox.protocol.states import LocalTransactionState

State = LocalTransactionState


class Resolver(Protocol):
    def resolve(self, txn_ids: Sequence[str]) -> dict[str, State]: ...


class FunctionResolver:
    """A user's ``check_local_transaction(txn_id)``, RocketMQ style; exceptions mean UNKNOWN."""

    def __init__(self, check: Callable[[str], State]) -> None:
        self.check = check

    def resolve(self, txn_ids: Sequence[str]) -> dict[str, State]:
        answers = {}
        for txn_id in txn_ids:
            try:
                answer = self.check(txn_id)
            except Exception:
                answer = State.UNKNOWN
            answers[txn_id] = answer if isinstance(answer, State) else State.UNKNOWN
        return answers


class FencedResolver:
    """Answers from the evidence table, fencing transactions that left none."""

    def __init__(
        self, engine: sa.Engine, producer_group: str, *, lock_timeout_s: float = 2.0
    ) -> None:
        self.engine = engine
        self.producer_group = producer_group
        self.lock_timeout_s = lock_timeout_s

    def resolve(self, txn_ids: Sequence[str]) -> dict[str, State]:
        known = self._known(txn_ids)
        answers = {t: _state(known[t]) for t in txn_ids if t in known}
        for txn_id in txn_ids:
            if txn_id not in answers:
                answers[txn_id] = self._fence(txn_id)
        return answers

    def _known(self, txn_ids: Sequence[str]) -> dict[str, str]:
        query = sa.select(evidence_table.c.txn_id, evidence_table.c.kind).where(
            evidence_table.c.txn_id.in_(list(txn_ids))
        )
        with self.engine.connect() as conn:
            return {row.txn_id: row.kind for row in conn.execute(query)}

    def _fence(self, txn_id: str) -> State:
        row = {
            "txn_id": txn_id,
            "kind": FENCE,
            "producer_group": self.producer_group,
            "created_at": dt.datetime.now(dt.UTC),
        }
        try:
            with self.engine.begin() as conn, self._bounded_wait(conn):
                conn.execute(evidence_table.insert(), [row])
            return State.ROLLBACK
        except sa.exc.IntegrityError:
            # The transaction committed its evidence while we waited (or a fence exists).
            kind = self._known([txn_id]).get(txn_id)
            return _state(kind) if kind else State.UNKNOWN
        except sa.exc.OperationalError:
            # Lock wait ran out (PG lock_timeout, SQLite busy): the transaction is still running.
            return State.UNKNOWN

    @contextmanager
    def _bounded_wait(self, conn: sa.Connection) -> Iterator[None]:
        """Wait at most ``lock_timeout_s`` for the row (PG) or the write lock (SQLite).

        PostgreSQL's ``SET LOCAL`` ends with the transaction. SQLite's busy timeout belongs to
        the connection, which goes back to a pool the application's sessions share, so it is
        put back as it was.
        """
        millis = int(self.lock_timeout_s * 1000)
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text(f"SET LOCAL lock_timeout = {millis}"))
            yield
        elif conn.dialect.name == "sqlite":
            before = conn.exec_driver_sql("PRAGMA busy_timeout").scalar()
            conn.exec_driver_sql(f"PRAGMA busy_timeout = {millis}")
            try:
                yield
            finally:
                conn.exec_driver_sql(f"PRAGMA busy_timeout = {int(before or 0)}")
        else:
            yield


def _state(kind: str) -> State:
    return State.COMMIT if kind == EVIDENCE else State.ROLLBACK

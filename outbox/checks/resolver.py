"""Answering a check: COMMIT, ROLLBACK or UNKNOWN for each transaction asked about.

- :class:`FencedResolver`, the default for the decorator and context-manager forms, answers from
  the evidence table and never answers ROLLBACK for a transaction that can still commit. It looks
  for the evidence row the transaction wrote; when there is none it inserts a *fence* row under
  the same key. If that insert succeeds, the transaction cannot commit any more (its own evidence
  insert would fail), so ROLLBACK is the truth. If the transaction still holds its row
  (PostgreSQL: an uncommitted insert of the same key; SQLite: the write lock), the insert waits
  at most ``lock_timeout_s`` and the answer is UNKNOWN. A transaction older than the evidence
  table's pruning horizon (:mod:`outbox.pruning`) is never fenced: its row may have been pruned,
  so it answers UNKNOWN. Nor does it fence in a database that lacks the evidence rows the
  producer's latest COMMITs wrote (:mod:`outbox.witnesses`): it is not the database the
  transactions commit to, and it answers UNKNOWN, logging why.
- :class:`~outbox.checks.listener.FunctionResolver` asks the application's
  ``check_local_transaction(message)``, RocketMQ's way.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

import sqlalchemy as sa

from outbox.evidence import EVIDENCE, FENCE, evidence_table
from outbox.metrics import ProducerMetrics
from outbox.protocol.check import CheckedTransaction
from outbox.protocol.ids import transaction_id_millis
from outbox.protocol.states import LocalTransactionState
from outbox.pruning import PRUNE_MARGIN_MS, pruned_before_ms
from outbox.witnesses import CommitWitnesses

State = LocalTransactionState
log = logging.getLogger("outbox.checks")


class Resolver(Protocol):
    """Answers a batch of checks: a state for each transaction id (a missing one is UNKNOWN)."""

    def resolve(self, checks: Sequence[CheckedTransaction]) -> dict[str, State]: ...


class FencedResolver:
    """Answers from the evidence table, fencing transactions that left none.

    ``metrics`` counts each fence written (``outbox_producer_fences_total``); a resolver made
    by the producer gets the producer's, one made by hand takes ``metrics=producer.metrics``.
    ``witnesses`` likewise (``witnesses=producer.witnesses``): without them the resolver cannot
    tell that its engine is another database than the transactions commit to.
    """

    #: Needs only the transaction ids: a value the checker left out need not be fetched.
    needs_messages = False

    def __init__(
        self,
        engine: sa.Engine,
        producer_group: str,
        *,
        lock_timeout_s: float = 2.0,
        metrics: ProducerMetrics | None = None,
        witnesses: CommitWitnesses | None = None,
    ) -> None:
        self.engine = engine
        self.producer_group = producer_group
        self.lock_timeout_s = lock_timeout_s
        self.metrics = metrics
        self.witnesses = witnesses

    def resolve(self, checks: Sequence[CheckedTransaction]) -> dict[str, State]:
        with self.engine.connect() as conn:
            return self.resolve_on(conn, checks)

    def resolve_on(
        self, conn: sa.Connection, checks: Sequence[CheckedTransaction]
    ) -> dict[str, State]:
        """:meth:`resolve` on one connection (the asyncio resolver runs it through
        ``AsyncConnection.run_sync``: one way of answering for both)."""
        txn_ids = [c.txn_id for c in checks]
        witnesses = {} if self.witnesses is None else self.witnesses.latest()
        known = self._known(conn, list(dict.fromkeys([*txn_ids, *witnesses.values()])))
        answers = {t: _state(known[t]) for t in txn_ids if t in known}
        missing = [t for t in txn_ids if t not in answers]
        if missing:
            horizon = pruned_before_ms(conn)
            conn.rollback()  # end the read: each fence is a transaction of its own
            unseen = {
                database: t
                for database, t in witnesses.items()
                if t not in known and not _maybe_pruned(t, horizon)
            }
            if unseen:
                self._refuse_to_fence(conn, missing, unseen)
                return {**answers, **dict.fromkeys(missing, State.UNKNOWN)}
            for txn_id in missing:
                answers[txn_id] = (
                    State.UNKNOWN if _maybe_pruned(txn_id, horizon) else self._fence(conn, txn_id)
                )
        return answers

    def _refuse_to_fence(
        self, conn: sa.Connection, missing: Sequence[str], unseen: dict[str, str]
    ) -> None:
        """The engine is not (or not the only) database this producer's transactions commit
        to: a fence here would answer ROLLBACK for transactions that may have committed there.
        Say so; the checker asks again (and again: the error repeats until it is fixed)."""
        here = conn.engine.url.render_as_string(hide_password=True)
        there = "; ".join(f"{t} committed in {database}" for database, t in unseen.items())
        log.error(
            "not fencing %d transaction(s) (answering UNKNOWN, e.g. %s): the check endpoint's "
            "database %s does not hold the evidence rows of transactions this producer "
            "committed (%s). Give serve_checks()/check_app() the engine of the database the "
            "transactions write to; a producer group whose transactions commit to several "
            "databases needs a producer group per database",
            len(missing),
            missing[0],
            here,
            there,
        )

    def _known(self, conn: sa.Connection, txn_ids: Sequence[str]) -> dict[str, str]:
        query = sa.select(evidence_table.c.txn_id, evidence_table.c.kind).where(
            evidence_table.c.txn_id.in_(list(txn_ids))
        )
        try:
            return {row.txn_id: row.kind for row in conn.execute(query)}
        finally:
            conn.rollback()

    def _fence(self, conn: sa.Connection, txn_id: str) -> State:
        row = {
            "txn_id": txn_id,
            "kind": FENCE,
            "producer_group": self.producer_group,
            "created_at": dt.datetime.now(dt.UTC),
        }
        try:
            with conn.begin(), self._bounded_wait(conn):
                conn.execute(evidence_table.insert(), [row])
        except sa.exc.IntegrityError:
            # The transaction committed its evidence while we waited (or a fence exists).
            kind = self._known(conn, [txn_id]).get(txn_id)
            return _state(kind) if kind else State.UNKNOWN
        except sa.exc.DBAPIError:
            # Lock wait ran out (PG lock_timeout, SQLite busy; asyncpg reports it as a plain
            # DBAPIError), or the database failed: the transaction may still be running.
            return State.UNKNOWN
        if self.metrics is not None:  # committed: the transaction can no longer commit
            self.metrics.fenced()
        return State.ROLLBACK

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


def _maybe_pruned(txn_id: str, horizon_ms: int | None) -> bool:
    """Whether the evidence row of ``txn_id`` may have been pruned: the transaction began before
    the horizon (its id's UUIDv7 time and its row's ``created_at`` come from the same producer
    clock, the id first), with a margin for that clock stepping back in between."""
    if horizon_ms is None:
        return False
    if txn_id[14:15] != "7":
        return True  # not a UUIDv7 (the version digit): its age is unknown
    return transaction_id_millis(txn_id) < horizon_ms + PRUNE_MARGIN_MS


def _state(kind: str) -> State:
    return State.COMMIT if kind == EVIDENCE else State.ROLLBACK

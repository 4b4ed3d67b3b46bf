"""Pruning the evidence table: bounded by a retention, and never a wrong ROLLBACK.

Every transaction leaves one row in ``outbox_evidence`` (its evidence, or a check's fence), so
the table grows with traffic. A row is needed while a check of its transaction can come: while
its half records can still be checked (the half topic's retention, 7 days by the broker's
default, plus the checker's give-up window) and, later, only when an operator resumes a
given-up transaction from the dead-letter topic.

The rule (docs/checks.md, "Pruning the evidence table"):

1. :func:`prune_evidence` first records the cut-off (now minus the retention) as the table's
   *horizon*, then deletes rows created before it, in batches.
2. A check that finds no row for a transaction that began before the horizon answers UNKNOWN,
   never fences: its row may be one of those pruned. A transaction id is a UUIDv7, so when it
   began is known from the id alone, on the same producer clock that stamped its row.
3. The retention may not be shorter than :data:`MIN_RETENTION`; the default,
   :data:`DEFAULT_RETENTION`, outlasts the half topic's default retention.

So a check arriving after pruning answers from the row when it is still there, UNKNOWN when it
may have been pruned, and fences only transactions younger than the horizon, whose rows were
never touched.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import sqlalchemy as sa

from outbox.errors import ConfigurationError
from outbox.evidence import evidence_table, horizon_table

#: Shortest retention :func:`prune_evidence` accepts: no transaction stays open that long
#: between its first half message and its evidence row.
MIN_RETENTION = dt.timedelta(days=1)
#: The half topic keeps records 7 days by the broker's default; this keeps evidence twice that.
DEFAULT_RETENTION = dt.timedelta(days=14)
#: A transaction that began this close after the horizon is treated as before it: the producer
#: clock may step back a little between the id and the row it stamps.
PRUNE_MARGIN_MS = 10 * 60 * 1000


@dataclass(frozen=True)
class PruneResult:
    """What one :func:`prune_evidence` call did."""

    deleted: int
    pruned_before: dt.datetime


def prune_evidence(
    engine: sa.Engine,
    *,
    older_than: dt.timedelta = DEFAULT_RETENTION,
    batch_size: int = 10_000,
    now: dt.datetime | None = None,
) -> PruneResult:
    """Delete evidence and fence rows created more than ``older_than`` before ``now``.

    Safe to run while producers and checks run, and to run again: the horizon only moves
    forward, and each batch is its own short transaction.

    Args:
        older_than: the retention; at least :data:`MIN_RETENTION`.
        batch_size: rows deleted per database transaction.
        now: the time to prune as of (aware); defaults to this host's clock.

    Raises:
        ConfigurationError: ``older_than`` shorter than :data:`MIN_RETENTION`, or a bad
            ``batch_size``.
    """
    if older_than < MIN_RETENTION:
        raise ConfigurationError(
            f"evidence retention {older_than} is shorter than {MIN_RETENTION}: keep rows at "
            "least as long as the half topic keeps records (7 days by default), so that the "
            "checks that can still come find them"
        )
    if batch_size < 1:
        raise ConfigurationError(f"batch_size={batch_size!r} must be at least 1")
    cutoff = (now or dt.datetime.now(dt.UTC)) - older_than
    with engine.begin() as conn:  # the horizon first: a row is never gone while it lags
        _advance_horizon(conn, int(cutoff.timestamp() * 1000))
    deleted = 0
    old = sa.select(evidence_table.c.txn_id).where(evidence_table.c.created_at < cutoff)
    while True:
        with engine.begin() as conn:
            batch = old.limit(batch_size).scalar_subquery()
            done = conn.execute(evidence_table.delete().where(evidence_table.c.txn_id.in_(batch)))
        deleted += done.rowcount
        if done.rowcount < batch_size:
            return PruneResult(deleted, cutoff)


def pruned_before_ms(conn: sa.Connection) -> int | None:
    """The horizon (Unix ms) before which rows may have been pruned; None if never pruned."""
    query = sa.select(horizon_table.c.pruned_before_ms).where(horizon_table.c.id == 1)
    value = conn.execute(query).scalar()
    return None if value is None else int(value)


def _advance_horizon(conn: sa.Connection, cutoff_ms: int) -> None:
    current = pruned_before_ms(conn)
    if current is None:
        conn.execute(horizon_table.insert(), {"id": 1, "pruned_before_ms": cutoff_ms})
    elif cutoff_ms > current:
        conn.execute(
            horizon_table.update().where(horizon_table.c.id == 1),
            {"pruned_before_ms": cutoff_ms},
        )

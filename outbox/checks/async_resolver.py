"""The evidence-table answer for an asyncio application: :class:`AsyncFencedResolver`.

It answers exactly as :class:`~outbox.checks.resolver.FencedResolver` does - the same queries,
fences and pruning rule, run by that class on one connection - through SQLAlchemy's
``AsyncConnection.run_sync``, so an application on an ``AsyncEngine`` (asyncpg, psycopg's async
mode, aiosqlite) needs no synchronous driver, and the check endpoint's database work never blocks
its event loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from outbox.checks.resolver import FencedResolver, State
from outbox.metrics import ProducerMetrics
from outbox.protocol.check import CheckedTransaction
from outbox.witnesses import CommitWitnesses

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine


class AsyncFencedResolver:
    """Answers from the evidence table on an ``AsyncEngine``, fencing transactions that left
    none (see :class:`~outbox.checks.resolver.FencedResolver`; ``metrics`` counts the fences
    as there)."""

    #: Needs only the transaction ids: a value the checker left out need not be fetched.
    needs_messages = False

    def __init__(
        self,
        engine: AsyncEngine,
        producer_group: str,
        *,
        lock_timeout_s: float = 2.0,
        metrics: ProducerMetrics | None = None,
        witnesses: CommitWitnesses | None = None,
    ) -> None:
        self.engine = engine
        self.producer_group = producer_group
        self._fenced = FencedResolver(
            engine.sync_engine,
            producer_group,
            lock_timeout_s=lock_timeout_s,
            metrics=metrics,
            witnesses=witnesses,
        )

    async def resolve(self, checks: Sequence[CheckedTransaction]) -> dict[str, State]:
        async with self.engine.connect() as conn:
            return await conn.run_sync(self._fenced.resolve_on, checks)

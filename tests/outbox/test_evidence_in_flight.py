"""The evidence row and the first half send: where the database locks rows (PostgreSQL) the row
is inserted while the half records travel to Kafka, so the two round trips overlap; on SQLite,
whose one write lock would be held for Kafka's round trip, only once they are acknowledged.
Either way the row commits only with every half acknowledged, and the COMMIT op names them.

Which came first is read at the INSERT itself: the transaction's coordinates name no offset
until Kafka has acknowledged its first half record. (The relay does not care which came first:
it reads the half and op topics, checked here; promotion is every pipeline test's subject.)
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session, sessionmaker

import outbox
from outbox import OutboxProducer
from outbox.evidence import evidence_table
from outbox.protocol.states import OpState
from tests.outbox.test_asyncio import async_factory
from tests.producer_fixtures import Topics, evidence_ids, order_ids, orders

pytestmark = pytest.mark.integration


@contextmanager
def offsets_at_evidence_insert(engine: sa.Engine) -> Iterator[list[tuple[int, ...]]]:
    """The current transaction's acknowledged half offsets at each evidence INSERT."""
    seen: list[tuple[int, ...]] = []
    insert = str(evidence_table.insert()).split("(")[0]  # "INSERT INTO outbox_evidence "

    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith(insert):
            coordinates = outbox.current_transaction().coordinates
            seen.append(() if coordinates is None else coordinates.offsets)

    sa.event.listen(engine, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", before)


@pytest.mark.parametrize("form", ["sync", "async"])
def test_the_evidence_row_travels_with_the_first_half_where_the_database_locks_rows(
    producer: OutboxProducer,
    engine: sa.Engine,
    session_factory: sessionmaker[Session],
    db_url: str,
    topics: Topics,
    form: str,
) -> None:
    sqlite = db_url.startswith("sqlite")
    order_id = f"order-{uuid.uuid4().hex[:12]}"
    seen: list[tuple[int, ...]] = []
    # When a transaction sends two messages (two sends) and writes its order
    if form == "sync":
        with offsets_at_evidence_insert(engine) as found:

            @outbox.transactional(producer=producer, session_factory=session_factory)
            def place(*, session: Session) -> str:
                outbox.send("orders", order_id, key=order_id)
                outbox.send("orders", order_id + "-2", key=order_id)
                session.execute(orders.insert().values(id=order_id, amount=1))
                return outbox.current_transaction().txn_id

            txn_id = place()
            seen.extend(found)
    else:

        async def place_async() -> str:
            async with async_factory(db_url) as factory:
                async_engine = factory.kw["bind"]
                with offsets_at_evidence_insert(async_engine.sync_engine) as found:

                    @outbox.transactional(producer=producer, session_factory=factory)
                    async def place(*, session: AsyncSession) -> str:
                        await outbox.send("orders", order_id, key=order_id)
                        await outbox.send("orders", order_id + "-2", key=order_id)
                        await session.execute(orders.insert().values(id=order_id, amount=1))
                        return outbox.current_transaction().txn_id

                    txn = await place()
                    seen.extend(found)
                    return txn

        txn_id = asyncio.run(place_async())
    # Then the evidence row was inserted once, with the first send: before its
    # acknowledgement on PostgreSQL, after it on SQLite
    assert len(seen) == 1, seen
    [offsets] = seen
    if sqlite:
        assert len(offsets) == 1, f"SQLite must wait for the acknowledgement: {offsets}"
    else:
        assert offsets == (), f"the INSERT waited for Kafka's acknowledgement: {offsets}"
    # And the row and the order committed, and the COMMIT op names both half records
    assert evidence_ids(engine).get(txn_id) == "evidence"
    assert order_id in order_ids(engine)
    halves = [h for h in topics.halves() if h.txn_id == txn_id]
    assert [h.message.value for h in halves] == [order_id.encode(), (order_id + "-2").encode()]
    [op] = [o for o in topics.ops() if o.txn_id == txn_id]
    assert op.state is OpState.COMMIT and len(op.half_offsets) == 2, op

"""A broker that acknowledges late or never, under asyncio: no COMMIT before every half record
is acknowledged, in ``async def`` under ``@outbox.transactional`` and in ``async with
producer.transaction()``.

``await outbox.send()`` returns once its records are acknowledged, on every database (other
tasks run meanwhile; on PostgreSQL the evidence row is inserted while the records travel), so
the code after it runs only then, and the COMMIT follows. The sync forms' cases are in
:mod:`tests.outbox.test_broker_down`, whose brokers and checks these share.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session

import outbox
from outbox import OutboxProducer, OutboxSettings
from outbox.async_transaction import AsyncOutboxTransaction
from outbox.testing import HarnessSettings, RunningService
from tests.kafka_helpers import unique
from tests.outbox.test_asyncio import async_url
from tests.outbox.test_broker_down import (
    assert_committed_and_delivered_once,
    assert_held_until_acknowledged,
    commits_of,
    late_settings,
    pausable_broker,
    paused,
    settings_for,
)
from tests.producer_fixtures import evidence_ids, order_ids, orders

pytestmark = [pytest.mark.integration, pytest.mark.processes]

#: One transaction: (producer, factory, real topic, order id, events) -> its id.
Place = Callable[
    [OutboxProducer, async_sessionmaker[AsyncSession], str, str, list[tuple[str, float]]],
    Awaitable[str],
]


class Recorded(Session):
    """The sync session under the tests' ``AsyncSession``: its commits are listened to."""


async def decorated(
    producer: OutboxProducer,
    factory: async_sessionmaker[AsyncSession],
    topic: str,
    order_id: str,
    events: list[tuple[str, float]],
) -> str:
    @outbox.transactional(producer=producer, session_factory=factory)
    async def place(*, session: AsyncSession) -> str:
        txn = outbox.current_transaction()
        assert isinstance(txn, AsyncOutboxTransaction)
        await outbox.send(topic, order_id, key=order_id)
        events.append(("after the send", time.monotonic()))
        await session.execute(orders.insert().values(id=order_id, amount=1))
        events.append((f"written, acknowledged: {txn.core.settled}", time.monotonic()))
        return txn.txn_id

    return await place()


async def in_context(
    producer: OutboxProducer,
    factory: async_sessionmaker[AsyncSession],
    topic: str,
    order_id: str,
    events: list[tuple[str, float]],
) -> str:
    async with producer.transaction(factory) as txn:
        assert isinstance(txn.session, AsyncSession)
        await txn.send(topic, order_id, key=order_id)
        events.append(("after the send", time.monotonic()))
        await txn.session.execute(orders.insert().values(id=order_id, amount=1))
        events.append((f"written, acknowledged: {txn.core.settled}", time.monotonic()))
        return txn.txn_id


FORMS: dict[str, Place] = {"decorator": decorated, "with": in_context}


@pytest.mark.parametrize("form", list(FORMS))
def test_an_async_transaction_commits_only_once_its_late_acknowledgement_comes(
    harness_settings: HarnessSettings,
    tmp_path: Path,
    engine: sa.Engine,
    db_url: str,
    form: str,
) -> None:
    place = FORMS[form]
    with pausable_broker(harness_settings, tmp_path) as broker:
        settings = late_settings(broker)
        topic = unique("orders")
        order_id = f"order-{uuid.uuid4().hex[:12]}"
        events: list[tuple[str, float]] = []

        async def main(producer: OutboxProducer) -> tuple[str, float, float]:
            async_engine = create_async_engine(async_url(db_url))
            factory = async_sessionmaker(
                async_engine, expire_on_commit=False, sync_session_class=Recorded
            )
            try:
                # the producer has its producer id
                await place(producer, factory, unique("warm-up"), order_id + "-warm", events)
                # Given a broker that stops answering for a while
                with paused(broker) as paused_at:
                    # When a transaction sends and writes meanwhile
                    txn_id = await place(producer, factory, topic, order_id, events)
                    returned = time.monotonic()
                return txn_id, paused_at, returned
            finally:
                await async_engine.dispose()

        with commits_of(Recorded) as commits, OutboxProducer(settings) as producer:
            txn_id, paused_at, returned = asyncio.run(main(producer))
        # Then the database committed, and the call returned, only after the broker answered
        assert_held_until_acknowledged(events, commits, paused_at, returned, send_waits=True)
        # And everything committed, the COMMIT op names the half record, delivered once
        assert_committed_and_delivered_once(broker, settings, engine, topic, order_id, txn_id)


@pytest.mark.parametrize("form", list(FORMS))
def test_an_async_half_send_never_acknowledged_commits_nothing(
    doomed_kafka: RunningService, engine: sa.Engine, db_url: str, form: str
) -> None:
    settings: OutboxSettings = settings_for(doomed_kafka, send_attempts=2)
    order_id = f"order-{uuid.uuid4().hex[:12]}"
    events: list[tuple[str, float]] = []
    evidence_before = set(evidence_ids(engine))

    async def main(producer: OutboxProducer) -> None:
        async_engine = create_async_engine(async_url(db_url))
        try:
            factory = async_sessionmaker(async_engine, expire_on_commit=False)
            await FORMS[form](producer, factory, "orders", order_id, events)
        finally:
            await async_engine.dispose()

    with OutboxProducer(settings) as producer:
        assert producer.partitions == 2  # the producer knew the broker before it went away
        # Given the broker is stopped
        doomed_kafka.stop()
        # When a transaction tries to send its half message
        with pytest.raises(outbox.HalfSendError, match=r"not acknowledged|refused|timed out"):
            asyncio.run(main(producer))
    # Then the code after the send never ran: the send raised
    assert events == []
    # And nothing committed: the DB proves it
    assert order_id not in order_ids(engine)
    assert set(evidence_ids(engine)) == evidence_before

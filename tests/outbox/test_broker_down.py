"""A half send that Kafka does not acknowledge keeps the local transaction from committing."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import sessionmaker

import outbox
from outbox import OutboxProducer, OutboxSettings, ensure_topics
from outbox.testing import RunningService
from tests.producer_fixtures import evidence_ids, order_ids, orders

pytestmark = [pytest.mark.integration, pytest.mark.processes]


def test_half_send_failure_with_the_broker_stopped_runs_no_local_transaction(
    doomed_kafka: RunningService, session_factory: sessionmaker, engine: sa.Engine
) -> None:
    settings = OutboxSettings(
        bootstrap_servers=doomed_kafka.address,
        producer_group="orders",
        partitions=2,
        send_timeout_s=2,
        send_attempts=2,
    )
    ensure_topics(settings)
    order_id = f"order-{uuid.uuid4().hex[:12]}"
    calls: list[str] = []
    with OutboxProducer(settings) as producer:
        assert producer.partitions == 2  # the producer knew the broker before it went away

        @outbox.transactional(producer=producer, session_factory=session_factory)
        def place(*, session: Any) -> None:
            calls.append(outbox.current_transaction().txn_id)
            outbox.send("orders", b"x", key=order_id)
            calls.append("local transaction ran after the send")
            session.execute(orders.insert().values(id=order_id, amount=1))

        # Given the broker is stopped
        doomed_kafka.stop()
        # When a transaction tries to send its half message
        with pytest.raises(outbox.HalfSendError, match=r"not acknowledged|refused|timed out"):
            place()
    # Then the local transaction did not run and the DB proves it
    [txn_id] = calls
    assert order_id not in order_ids(engine)
    assert txn_id not in evidence_ids(engine)

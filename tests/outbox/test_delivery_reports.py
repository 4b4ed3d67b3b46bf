"""Counting an op's delivery never fails: a metrics backend that raises costs the count. Before,
with ``wait_for_op`` the exception reached the caller after its transaction had committed (it
would retry committed work), and in the one-way form it ended the thread that serves every
later delivery report of the producer."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy.orm import Session, sessionmaker

import outbox
from outbox import OutboxProducer
from outbox.protocol.states import OpState
from tests.producer_fixtures import orders

pytestmark = pytest.mark.integration


def test_a_failing_report_handler_does_not_stop_the_reports_that_follow(
    producer: OutboxProducer, session_factory: sessionmaker, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert producer.metrics is not None, "prometheus_client is a dev dependency"
    failures = []

    def failing_once(state: OpState) -> None:
        if not failures:
            failures.append(state)
            raise RuntimeError("metrics backend failed")

    monkeypatch.setattr(producer.metrics, "op_written", failing_once)

    @outbox.transactional(producer=producer, session_factory=session_factory)
    def place(order_id: str, *, session: Session) -> None:
        outbox.send("orders-reports", order_id, key=order_id)
        session.execute(orders.insert().values(id=order_id, amount=1))

    before = producer.kafka.ops_sent
    for _ in range(3):
        place(f"reported-{uuid.uuid4().hex[:8]}")  # waits for its op's report (wait_for_op)
    assert failures == [OpState.COMMIT]
    # every op's report was served, the ones after the failing handler included
    assert producer.kafka.ops_sent - before == 3
    assert producer.kafka.ops_failed == 0

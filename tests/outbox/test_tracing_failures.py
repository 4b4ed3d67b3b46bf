"""Tracing never fails the work it watches: an OpenTelemetry SDK whose span processor raises
(the SDK passes its processors' errors on) costs spans, not transactions. Before, a processor
failing as the ``outbox.commit`` span ended told the caller that a committed transaction had
failed (no op written, the checker left to deliver what the caller may retry), and one failing
in the relay or the checker stopped every batch or round."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

import outbox
from outbox import OutboxProducer, tracing
from tests.checker.test_checker import SECRET
from tests.pipeline import ops_lost, pipeline
from tests.producer_fixtures import Topics, order_ids, orders

pytestmark = pytest.mark.integration


class Broken:
    """A span processor that raises on every span it sees."""

    def on_start(self, span: object, parent_context: object = None) -> None:
        raise RuntimeError("span processor failed on start")

    def _on_ending(self, span: object) -> None:
        pass

    def on_end(self, span: object) -> None:
        raise RuntimeError("span processor failed on end")

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


@pytest.fixture
def broken_tracing() -> Iterator[None]:
    from opentelemetry.sdk.trace import TracerProvider

    assert tracing.load() is not None, "opentelemetry-api is a dev dependency"
    provider = TracerProvider()
    provider.add_span_processor(Broken())  # type: ignore[arg-type]
    tracing.use_tracer_provider(provider)
    try:
        yield
    finally:
        tracing.use_tracer_provider(None)


def test_a_failing_span_processor_costs_spans_not_transactions(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    engine: sa.Engine,
    session_factory: sessionmaker,
    topics: Topics,
    monkeypatch: pytest.MonkeyPatch,
    broken_tracing: None,
) -> None:
    producer.serve_checks(engine=engine, secret=SECRET)
    with pipeline(kafka_bootstrap, topics) as running:

        @outbox.transactional(producer=producer, session_factory=session_factory)
        def place(order_id: str, *, session: Session) -> str:
            session.execute(orders.insert().values(id=order_id, amount=1))
            outbox.send(running.topic, order_id, key=order_id)
            return outbox.current_transaction().txn_id

        # When transactions run with every span failing: one whose op is written, one whose op
        # is lost (the checker decides it, its decision span failing too)
        written, lost = (f"traced-{uuid.uuid4().hex[:8]}" for _ in range(2))
        written_txn = place(written)  # returns: no exception from the tracing
        with ops_lost(producer, monkeypatch):
            lost_txn = place(lost)
        # Then both commit, are decided, and are delivered once by a relay tracing in vain
        assert running.decided([written_txn, lost_txn]) == {
            written_txn: "COMMIT",
            lost_txn: "COMMIT",
        }
        assert {written, lost} <= set(order_ids(engine))
        assert running.settle(lambda: {written, lost}) == {written: 1, lost: 1}

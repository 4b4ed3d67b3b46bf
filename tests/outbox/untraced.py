"""A producer, a relay and a checker in a process where OpenTelemetry cannot be imported.

Usage: python -m tests.outbox.untraced BOOTSTRAP PREFIX DB_URL (topics and database made by the
calling test). Prints "untraced: 2 delivered, no trace header" when a committed transaction and
one whose op was lost (decided by the checker) are both delivered, no record carries a trace
header, and nothing imported OpenTelemetry.
"""

from __future__ import annotations

import sys

sys.modules["opentelemetry"] = None  # type: ignore[assignment]  # before anything imports it

import pytest  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from sqlalchemy.orm import Session, sessionmaker  # noqa: E402

import checker  # noqa: E402, F401
import outbox  # noqa: E402
import relay  # noqa: E402, F401
from outbox import OutboxProducer, OutboxSettings, tracing  # noqa: E402
from tests.checker.test_checker import SECRET  # noqa: E402
from tests.kafka_helpers import unique  # noqa: E402
from tests.pipeline import ops_lost, pipeline  # noqa: E402
from tests.producer_fixtures import Topics, orders  # noqa: E402
from tests.relay.test_relay import read_topic  # noqa: E402

TRACE_HEADERS = {"traceparent", "tracestate", "baggage"}


def main() -> None:
    bootstrap, prefix, db_url = sys.argv[1:4]
    settings = OutboxSettings(
        bootstrap_servers=bootstrap,
        producer_group="orders",
        topic_prefix=prefix,
        partitions=3,
        send_timeout_s=5,
        wait_for_op=True,
    )
    engine = sa.create_engine(db_url)
    with OutboxProducer(settings) as producer:
        assert tracing.otel is None and tracing.load() is None
        producer.serve_checks(engine=engine, secret=SECRET)
        topics = Topics(bootstrap, settings)
        with pipeline(bootstrap, topics) as running:

            @outbox.transactional(producer=producer, session_factory=sessionmaker(engine))
            def place(order_id: str, *, session: Session) -> str:
                session.execute(orders.insert().values(id=order_id, amount=1))
                outbox.send(running.topic, order_id, key=order_id, headers={"k": "v"})
                return outbox.current_transaction().txn_id

            committed = unique("untraced")
            place(committed)
            lost = unique("untraced-lost")
            patch = pytest.MonkeyPatch()
            with ops_lost(producer, patch):
                txn_id = place(lost)
            assert running.decided({txn_id}) == {txn_id: "COMMIT"}
            running.settle(lambda: {committed, lost})
            records = [
                m
                for m in read_topic(bootstrap, running.topic)
                if m.value().decode() in {committed, lost}
            ]
            assert len(records) == 2, records
            for record in records:
                names = {name for name, _ in record.headers() or []}
                assert "k" in names and not names & TRACE_HEADERS, names
                assert tracing.extract_context(record) is None
                with tracing.consuming(record) as span:
                    assert span is None
            for half in topics.halves():
                assert not {n for n, _ in half.message.headers} & TRACE_HEADERS
    loaded = [name for name in sys.modules if name.startswith("opentelemetry.")]
    assert not loaded, loaded
    print(f"untraced: {len(records)} delivered, no trace header")


if __name__ == "__main__":
    main()

"""OpenTelemetry: one trace from the request that placed an order to the consumer that handled
it, through a real relay (and the checker when the op is lost), and nothing at all without the
API.

The spans are the SDK's, recorded in memory (tests.tracing_fixtures); the consumer reads the
real topic read_committed, as a user's would, and uses ``outbox.tracing.consuming``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    StatusCode,
    TraceFlags,
    use_span,
)
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session, sessionmaker

import outbox
from outbox import (
    AsyncTransactionalProducer,
    LocalTransactionState,
    Message,
    OutboxProducer,
    OutboxSettings,
    TransactionalProducer,
    migrations,
    tracing,
)
from outbox.half_sender import HalfBatch
from outbox.protocol.half import HalfMessage
from outbox.transaction import OutboxTransaction
from tests.checker.test_checker import SECRET
from tests.kafka_helpers import unique
from tests.outbox.test_asyncio import async_factory
from tests.pipeline import Pipeline, ops_lost, pipeline
from tests.producer_fixtures import Topics, orders, orders_metadata
from tests.relay.test_relay import read_topic
from tests.tracing_fixtures import Traces, traceparent, w3c


@pytest.fixture
def sqlite_engine(sqlite_url: str) -> Iterator[sa.Engine]:
    """What tracing does is the same on every database: these tests run on SQLite only."""
    migrations.upgrade(sqlite_url)
    engine = sa.create_engine(sqlite_url)
    orders_metadata.create_all(engine)
    yield engine
    engine.dispose()


def delivered(running: Pipeline, values: set[str], timeout: float = 60) -> list[Any]:
    """The real topic's records of ``values``, read read_committed once all are there."""
    deadline = time.monotonic() + timeout
    while True:
        found = [m for m in read_topic(running.bootstrap, running.topic) if m.value() is not None]
        found = [m for m in found if m.value().decode() in values]
        if {m.value().decode() for m in found} >= values:
            return found
        assert time.monotonic() < deadline, f"not delivered: {values}"
        time.sleep(0.5)


def context_of(span: ReadableSpan) -> tuple[int, int]:
    context = span.get_span_context()
    assert context is not None
    return context.trace_id, context.span_id


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def linked(span: ReadableSpan) -> set[tuple[int, int]]:
    return {(link.context.trace_id, link.context.span_id) for link in span.links}


# -- the producer's spans and headers, no services -----------------------------------------


def test_the_send_spans_context_rides_in_the_headers_and_a_callers_own_is_kept(
    traces: Traces,
) -> None:
    otel = tracing.otel
    assert otel is not None
    plain = HalfMessage("orders", b"1", headers=(("k", b"v"),))
    own = HalfMessage(
        "orders", b"2", headers=(("traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01"),)
    )
    # Outside any span nothing is carried: the messages are handed on as they are
    assert otel.carried([plain]) == [plain]
    with traces.tracer.start_as_current_span("request") as span:
        carried = list(otel.carried([plain, own]))
    assert carried[0].headers == (("k", b"v"), ("traceparent", traceparent(span)))
    # a traceparent the caller wrote is theirs: not replaced, not repeated
    assert carried[1] == own


def test_the_api_is_imported_by_the_first_producer_not_by_importing_the_packages() -> None:
    """A process that only migrates, or runs the CLI, never imports OpenTelemetry."""
    code = (
        "import sys, outbox, relay, checker\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')]\n"
        "settings = outbox.OutboxSettings(bootstrap_servers='localhost:9', producer_group='g')\n"
        "outbox.OutboxProducer(settings).close()\n"
        "assert 'opentelemetry.trace' in sys.modules and outbox.tracing.otel is not None\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_with_the_api_alone_the_callers_context_is_still_passed_on() -> None:
    """No SDK configured (every FastAPI application has the API): the sends skip their spans,
    which would record nothing, and a context propagated from upstream still reaches the half
    records."""
    otel = tracing.load()
    assert otel is not None and not otel.configured()
    sent: list[HalfBatch] = []

    class Kafka:
        def send_halves(self, batch: HalfBatch, meanwhile: Any = None) -> list[int]:
            sent.append(batch)
            return list(range(batch.first_index, batch.first_index + len(batch.messages)))

    class Host:
        settings = OutboxSettings(bootstrap_servers="localhost:9", producer_group="orders")
        serializer = None
        key_serializer = None
        kafka = Kafka()
        partitions = 3
        known_partitions = 3

    txn = OutboxTransaction(Host())  # type: ignore[arg-type]
    txn.send("orders", b"untraced")
    upstream = SpanContext(7, 9, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    with use_span(NonRecordingSpan(upstream)):
        txn.send("orders", b"from upstream")
    assert [dict(b.messages[0].headers).get("traceparent") for b in sent] == [None, w3c(7, 9, 1)]


def test_consuming_makes_the_handlers_span_the_child_of_the_producers(traces: Traces) -> None:
    class Record:
        def __init__(self, headers: list[tuple[str, bytes]]) -> None:
            self._headers = headers

        def headers(self) -> list[tuple[str, bytes]]:
            return self._headers

        def topic(self) -> str:
            return "orders"

        def partition(self) -> int:
            return 2

        def offset(self) -> int:
            return 41

    with traces.tracer.start_as_current_span("outbox.send") as sender:
        context = sender.get_span_context()
    promoted = [
        ("traceparent", traceparent(sender)),
        ("outbox-txn-id", b"01a203d8-301f-7701-b6f4-468c06c700b2"),
        ("outbox-producer-group", b"orders"),
        ("outbox-message-index", b"3"),
    ]
    with pytest.raises(KeyError), tracing.consuming(Record(promoted), consumer_group="billing"):
        raise KeyError("handler failed")
    with tracing.consuming(Record([])):
        pass
    child, root = traces.named("process orders")
    assert child.kind is SpanKind.CONSUMER
    assert context_of(child)[0] == context.trace_id
    assert parent_of(child) == context.span_id
    assert dict(child.attributes or {}) == {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "orders",
        "messaging.destination.partition.id": "2",
        "messaging.kafka.offset": 41,
        "messaging.consumer.group.name": "billing",
        "outbox.transaction.id": "01a203d8-301f-7701-b6f4-468c06c700b2",
        "outbox.producer.group": "orders",
        "outbox.message.index": 3,
    }
    assert child.status.status_code is StatusCode.ERROR
    assert [e.name for e in child.events] == ["exception"]
    # a record without trace headers starts a trace of its own
    assert root.parent is None and context_of(root)[0] != context.trace_id
    # extract_context reads a record or its headers alike
    for carrier in (Record(promoted), promoted):
        extracted = tracing.extract_context(carrier)
        with traces.tracer.start_as_current_span("handle", context=extracted) as handled:
            pass
        assert handled.get_span_context().trace_id == context.trace_id


# -- through the real relay and checker ----------------------------------------------------


@pytest.mark.integration
def test_one_trace_from_the_request_through_the_relay_to_the_consumer(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    sqlite_engine: sa.Engine,
    topics: Topics,
    traces: Traces,
) -> None:
    with pipeline(kafka_bootstrap, topics) as running:

        @outbox.transactional(producer=producer, session_factory=sessionmaker(sqlite_engine))
        def place(order_id: str, *, session: Session) -> str:
            session.execute(orders.insert().values(id=order_id, amount=1))
            outbox.send(running.topic, order_id, key=order_id)
            return outbox.current_transaction().txn_id

        order_id = unique("traced")
        # Given a request span around an @outbox.transactional call
        with traces.tracer.start_as_current_span("POST /orders") as request:
            txn_id = place(order_id)
        # when a consumer reads the real topic and handles the record with the helper
        [record] = delivered(running, {order_id})
        with tracing.consuming(record, consumer_group="billing"):
            pass
    request_trace, request_id = context_of(traces.one("POST /orders"))
    assert request_trace == request.get_span_context().trace_id
    # then the send is a PRODUCER span of the request, whose context the record carries
    send = traces.one("outbox.send")
    assert send.kind is SpanKind.PRODUCER
    assert parent_of(send) == request_id
    assert dict(send.attributes or {}) == {
        "messaging.system": "kafka",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": running.topic,
        "outbox.transaction.id": txn_id,
        "outbox.producer.group": "orders",
        "outbox.half.partition": send.attributes["outbox.half.partition"],  # type: ignore[index]
        "outbox.half.offset": send.attributes["outbox.half.offset"],  # type: ignore[index]
    }
    assert dict(record.headers())["traceparent"] == traceparent(send)
    # and the consumer's span is its child: one trace from the request to the consumer
    consumer = traces.one(f"process {running.topic}")
    assert context_of(consumer)[0] == request_trace
    assert parent_of(consumer) == context_of(send)[1]
    assert consumer.attributes["outbox.transaction.id"] == txn_id  # type: ignore[index]
    # the local commit and the op are spans of the request too
    commit = traces.one("outbox.commit")
    op = traces.one("outbox.op")
    assert parent_of(commit) == parent_of(op) == request_id
    assert commit.attributes["outbox.transaction.id"] == txn_id  # type: ignore[index]
    assert (op.attributes["outbox.op.state"], op.attributes["outbox.op.written"]) == (  # type: ignore[index]
        "COMMIT",
        True,
    )
    assert commit.end_time <= op.start_time  # type: ignore[operator]
    # and the relay's promotion links to the send, in a trace of its own (many requests' batch)
    promote = traces.wait("outbox.relay.promote", lambda s: context_of(send) in linked(s))
    assert context_of(promote)[0] != request_trace
    [link] = [link for link in promote.links if link.context.span_id == context_of(send)[1]]
    assert link.attributes["outbox.transaction.id"] == txn_id  # type: ignore[index]
    batch = traces.one("outbox.relay.batch", lambda s: context_of(s)[1] == parent_of(promote))
    assert batch.end_time >= promote.end_time  # type: ignore[operator]


@pytest.mark.integration
def test_a_transaction_the_checker_decides_is_linked_to_its_producers_span(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    sqlite_url: str,
    sqlite_engine: sa.Engine,
    topics: Topics,
    traces: Traces,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    producer.serve_checks(engine=sqlite_engine, secret=SECRET)
    order_id = unique("checked")
    values = {order_id, order_id + "-line"}
    with pipeline(kafka_bootstrap, topics) as running:

        async def main() -> str:
            async with async_factory(sqlite_url) as factory:

                @outbox.transactional(producer=producer, session_factory=factory)
                async def place(order_id: str, session: AsyncSession = outbox.INJECTED) -> str:
                    await session.execute(orders.insert().values(id=order_id, amount=1))
                    await outbox.send_batch(
                        [Message(running.topic, v, key=order_id) for v in sorted(values)]
                    )
                    return outbox.current_transaction().txn_id

                # Given an asyncio transaction in a request span, its op lost
                with traces.tracer.start_as_current_span("POST /orders"):
                    return await place(order_id)

        with ops_lost(producer, monkeypatch):
            txn_id = asyncio.run(main())
        # when the checker decides it from the evidence row and the relay promotes it
        assert running.decided({txn_id}) == {txn_id: "COMMIT"}
        records = delivered(running, values)
        for record in records:
            with tracing.consuming(record):
                pass
    request_trace, request_id = context_of(traces.one("POST /orders"))
    send = traces.one("outbox.send_batch")
    assert (send.kind, parent_of(send)) == (SpanKind.PRODUCER, request_id)
    assert send.attributes["messaging.batch.message_count"] == 2  # type: ignore[index]
    commit = traces.one("outbox.commit")
    assert (parent_of(commit), commit.status.status_code) == (request_id, StatusCode.UNSET)
    # the lost op shows as a failed op span
    op = traces.one("outbox.op")
    assert (op.attributes["outbox.op.written"], op.status.status_code) == (False, StatusCode.ERROR)  # type: ignore[index]
    # then the checker's decision links to the producer's span, from its own trace
    decide = traces.wait(
        "outbox.checker.decide",
        lambda s: s.attributes["outbox.transaction.id"] == txn_id,  # type: ignore[index]
    )
    assert linked(decide) == {context_of(send)}
    assert context_of(decide)[0] != request_trace
    assert decide.attributes["outbox.decision"] == "COMMIT"  # type: ignore[index]
    assert decide.status.status_code is StatusCode.UNSET
    # and so does the relay's promotion, and the consumers' spans are still the request's
    traces.wait("outbox.relay.promote", lambda s: context_of(send) in linked(s))
    consumers = traces.named(f"process {running.topic}")
    assert len(consumers) == 2
    assert {(context_of(c)[0], parent_of(c)) for c in consumers} == {
        (request_trace, context_of(send)[1])
    }


@pytest.mark.integration
def test_the_transactional_producer_forms_trace_the_send_the_local_transaction_and_the_op(
    outbox_settings: OutboxSettings, producer: OutboxProducer, topics: Topics, traces: Traces
) -> None:
    class Listener:
        def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
            return LocalTransactionState.COMMIT

        def check_local_transaction(self, msg: Message) -> LocalTransactionState:
            return LocalTransactionState.COMMIT

    listener = Listener()
    topic = unique("orders")
    # Given both RocketMQ-style forms, each in a span of the job that runs it
    with traces.tracer.start_as_current_span("sync job"):
        sync = TransactionalProducer(producer, listener).send_message_in_transaction(
            Message(topic, "a", key="a")
        )

    async def main() -> Any:
        with traces.tracer.start_as_current_span("async job"):
            return await AsyncTransactionalProducer(producer, listener).send_message_in_transaction(
                [Message(topic, "b", key="b"), Message(topic, "c", key="b")]
            )

    asynchronous = asyncio.run(main())
    halves = {h.txn_id: h for h in topics.halves()}
    for job, txn_id, name in (
        ("sync job", sync.transaction_id, "outbox.send"),
        ("async job", asynchronous.transaction_id, "outbox.send_batch"),
    ):
        parent = context_of(traces.one(job))[1]

        def of(span: ReadableSpan, txn_id: str = txn_id) -> bool:
            return span.attributes["outbox.transaction.id"] == txn_id  # type: ignore[index]

        # then the send, the listener's local transaction and the op are spans of the job
        send = traces.one(name, of)
        execute = traces.one("outbox.execute_local_transaction", of)
        op = traces.one("outbox.op", of)
        assert {parent_of(s) for s in (send, execute, op)} == {parent}
        assert send.end_time <= execute.start_time <= execute.end_time <= op.start_time  # type: ignore[operator]
        assert execute.attributes["outbox.local_transaction.state"] == "COMMIT"  # type: ignore[index]
        assert op.attributes["outbox.op.state"] == "COMMIT"  # type: ignore[index]
        # and the half records carry the send's context
        assert dict(halves[txn_id].message.headers)["traceparent"] == traceparent(send)


# -- without the API -----------------------------------------------------------------------


@pytest.mark.integration
def test_without_opentelemetry_a_transaction_works_and_writes_no_trace_headers(
    outbox_settings: OutboxSettings, sqlite_url: str, sqlite_engine: sa.Engine
) -> None:
    """In a process where ``import opentelemetry`` fails, a producer, a relay and a checker
    (``tests.outbox.untraced``) deliver a transaction and one whose op was lost."""
    root = Path(__file__).parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.outbox.untraced",
            outbox_settings.bootstrap_servers,
            outbox_settings.topic_prefix,
            sqlite_url,
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("untraced: 2 delivered, no trace header"), result.stdout

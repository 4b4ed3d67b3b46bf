"""OpenTelemetry tracing: one trace from the code that placed a request to the consumer that
handled it, through the half topic, the relay and (when an op is lost) the checker.

The producer starts an ``outbox.send`` (or ``outbox.send_batch``) span of kind PRODUCER around
each half send and writes its W3C trace context (the global propagator's headers: ``traceparent``,
``tracestate``, and ``baggage`` when there is some) into the half records as **ordinary message
headers**. The relay copies a message's headers to the promoted record as they are
(:func:`relay.promotion.promoted`), so the context reaches the real topic with no change to the
relay or to the record contract, a relay of the previous version carries it too, and any
consumer's OpenTelemetry Kafka instrumentation finds it under the standard names;
:func:`consuming` starts a consumer's span as its child. The relay's and the checker's spans
(``relay.tracing``, ``checker.tracing``) read the same headers to *link* to the producer's span:
a link, not a parent, because one relay batch promotes many transactions and a checker's
decision comes long after the request that caused it.

Only the OpenTelemetry API is used (``pip install 'kafka-outbox[tracing]'``), and only if it
imports: :func:`load` tries once, at the first ``OutboxProducer``, ``Relay`` or ``Checker``.
Without it, :data:`otel` stays None and the producer's hot paths pay one ``is None`` check.
With the API but no SDK configured, the producer starts no span (it would record nothing) and
writes only a valid context of the caller's (one propagated from upstream is passed on).
docs/tracing.md says what each span carries and what it costs.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from outbox.errors import ConfigurationError
from outbox.protocol.half import HalfMessage
from outbox.protocol.headers import RESERVED_HEADER_PREFIX, Header

log = logging.getLogger("outbox.tracing")

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, SpanContext, TracerProvider
    from opentelemetry.util.types import AttributeValue

    from outbox.protocol.op import OpRecord
    from outbox.protocol.states import LocalTransactionState
    from outbox.transaction import HalfCoordinates, OutboxTransaction

#: The instrumentation scope of every span the outbox records.
SCOPE = "kafka-outbox"

# Span names (docs/tracing.md).
SEND = "outbox.send"
SEND_BATCH = "outbox.send_batch"
COMMIT = "outbox.commit"
OP = "outbox.op"
EXECUTE = "outbox.execute_local_transaction"

# Attributes: OpenTelemetry's messaging conventions where one fits, ``outbox.*`` otherwise.
MESSAGING_SYSTEM = "messaging.system"
OPERATION_TYPE = "messaging.operation.type"
OPERATION_NAME = "messaging.operation.name"
DESTINATION = "messaging.destination.name"
DESTINATION_PARTITION = "messaging.destination.partition.id"
BATCH_COUNT = "messaging.batch.message_count"
KAFKA_OFFSET = "messaging.kafka.offset"
CONSUMER_GROUP = "messaging.consumer.group.name"
#: Set instead of :data:`DESTINATION` when one batch goes to several real topics.
DESTINATIONS = "outbox.destination.names"
TRANSACTION_ID = "outbox.transaction.id"
PRODUCER_GROUP = "outbox.producer.group"
MESSAGE_INDEX = "outbox.message.index"
HALF_PARTITION = "outbox.half.partition"
HALF_OFFSET = "outbox.half.offset"
OP_STATE = "outbox.op.state"
OP_WRITTEN = "outbox.op.written"
LOCAL_STATE = "outbox.local_transaction.state"

Attributes = dict[str, "AttributeValue"]
RawHeaders = Iterable[tuple[str, str | bytes | None]]


@runtime_checkable
class KafkaRecord(Protocol):
    """What :func:`consuming` reads of a record (a ``confluent_kafka.Message`` is one)."""

    def headers(self) -> list[tuple[str, bytes]] | None: ...
    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...


class Otel:
    """The OpenTelemetry API as the outbox uses it; made only when the API imports.

    Raises:
        ImportError: ``opentelemetry-api`` is not installed.
    """

    def __init__(self) -> None:
        from opentelemetry import propagate, trace
        from opentelemetry.trace import ProxyTracerProvider, SpanKind, Status, StatusCode

        from outbox import __version__

        self._trace = trace
        self._propagate = propagate
        self._version = __version__
        self.PRODUCER = SpanKind.PRODUCER
        self.CONSUMER = SpanKind.CONSUMER
        self.INTERNAL = SpanKind.INTERNAL
        self._status = Status
        self._error = StatusCode.ERROR
        self._placeholder = ProxyTracerProvider
        self._provider: TracerProvider | None = None
        self.tracer = trace.get_tracer(SCOPE, __version__)

    def use(self, provider: TracerProvider | None) -> None:
        """Record spans with ``provider`` (None: the global one, even if set later)."""
        self._provider = provider
        self.tracer = self._trace.get_tracer(SCOPE, self._version, tracer_provider=provider)

    def configured(self) -> bool:
        """Whether spans go to a tracer provider, not the API's placeholder for one.

        Until an SDK is configured (or :func:`use_tracer_provider` named one), the API's spans
        record nothing, and the context a send carries is the caller's whether a span is
        started or not: the producer's spans are skipped then, which saves the hot path some
        6 us per send (of 12; docs/tracing.md, "Cost"), and the caller's context still goes on.
        """
        return self._provider is not None or not isinstance(
            self._trace.get_tracer_provider(), self._placeholder
        )

    def failed(self, span: Span, description: str) -> None:
        """Mark ``span`` as failed (an outcome that is not an exception)."""
        span.set_status(self._status(self._error, description))

    # -- producer: half send -----------------------------------------------------------------

    def send(
        self,
        txn: OutboxTransaction,
        messages: Sequence[HalfMessage],
        count: int | None,
        send: Callable[[Sequence[HalfMessage], int | None], HalfCoordinates],
    ) -> HalfCoordinates:
        """``send(messages, count)`` in an ``outbox.send`` span, its context in the headers."""
        if not self.configured():
            return send(self.carried(messages), count)
        name, attributes = _send_span(txn, messages)
        with self.span(name, kind=self.PRODUCER, attributes=attributes) as s:
            coordinates = send(self.carried(messages), count)
            _sent(s, coordinates, len(messages))
            return coordinates

    async def send_async(
        self,
        txn: OutboxTransaction,
        messages: list[HalfMessage],
        count: int | None,
        send: Callable[[list[HalfMessage], int | None], Awaitable[HalfCoordinates]],
    ) -> HalfCoordinates:
        """:meth:`send` for the asyncio forms: the span is current in the awaiting task only."""
        if not self.configured():
            return await send(list(self.carried(messages)), count)
        name, attributes = _send_span(txn, messages)
        with self.span(name, kind=self.PRODUCER, attributes=attributes) as s:
            coordinates = await send(list(self.carried(messages)), count)
            _sent(s, coordinates, len(messages))
            return coordinates

    def carried(self, messages: Sequence[HalfMessage]) -> Sequence[HalfMessage]:
        """``messages`` with the current trace context added to their headers.

        The global propagator writes it, so a service configured for B3 or Jaeger headers
        propagates those. A header the message already has (a ``traceparent`` the caller set
        itself) is left as it is, not repeated: two values would leave the consumer's choice to
        chance. Names under the outbox's reserved prefix are never written as user headers.
        """
        carrier: dict[str, str] = {}
        try:
            self._propagate.inject(carrier)
        except Exception:  # a propagator's failure costs the context, never the send
            log.debug("tracing: the propagator failed to inject", exc_info=True)
            return messages
        if not carrier:  # no valid span context: nothing to carry
            return messages
        extra = tuple(
            (name, value.encode())
            for name, value in carrier.items()
            if not name.lower().startswith(RESERVED_HEADER_PREFIX)
        )
        return [_with_headers(m, extra) for m in messages]

    # -- producer: local transaction and op ------------------------------------------------

    def commit(self, txn: OutboxTransaction, commit: Callable[[], None]) -> None:
        """The local database COMMIT in an ``outbox.commit`` span."""
        if not self.configured():
            return commit()
        with self.span(COMMIT, attributes=_txn_attributes(txn)):
            commit()

    async def commit_async(
        self, txn: OutboxTransaction, commit: Callable[[], Awaitable[None]]
    ) -> None:
        """:meth:`commit`, awaited."""
        if not self.configured():
            return await commit()
        with self.span(COMMIT, attributes=_txn_attributes(txn)):
            await commit()

    def execute(
        self, txn: OutboxTransaction, execute: Callable[[], LocalTransactionState]
    ) -> LocalTransactionState:
        """A ``TransactionalProducer`` listener's local transaction in its span."""
        if not self.configured():
            return execute()
        with self.span(EXECUTE, attributes=_txn_attributes(txn)) as span:
            state = execute()
            _quietly(span, "set_attribute", LOCAL_STATE, state.value)
            return state

    async def execute_async(
        self, txn: OutboxTransaction, execute: Callable[[], Awaitable[LocalTransactionState]]
    ) -> LocalTransactionState:
        """:meth:`execute`, awaited."""
        if not self.configured():
            return await execute()
        with self.span(EXECUTE, attributes=_txn_attributes(txn)) as span:
            state = await execute()
            _quietly(span, "set_attribute", LOCAL_STATE, state.value)
            return state

    def op(self, op: OpRecord, send: Callable[[OpRecord], bool]) -> bool:
        """The op record's send in an ``outbox.op`` span; a lost op marks it failed."""
        if not self.configured():
            return send(op)
        with self.span(OP, attributes=_op_attributes(op)) as span:
            written = send(op)
            self._op_sent(span, written)
            return written

    async def op_async(self, op: OpRecord, send: Callable[[OpRecord], Awaitable[bool]]) -> bool:
        """:meth:`op`, awaited."""
        if not self.configured():
            return await send(op)
        with self.span(OP, attributes=_op_attributes(op)) as span:
            written = await send(op)
            self._op_sent(span, written)
            return written

    def _op_sent(self, span: Span | None, written: bool) -> None:
        if span is None:
            return
        try:
            span.set_attribute(OP_WRITTEN, written)
            if not written:
                self.failed(span, "op record not written; the checker resolves the transaction")
        except Exception:
            log.debug("tracing: could not mark the op span", exc_info=True)

    @contextmanager
    def span(self, name: str, **options: Any) -> Iterator[Span | None]:
        """``tracer.start_as_current_span(name, **options)`` that never fails the work it
        watches: tracing runs inside a transaction, some of it after the database committed
        (the commit and op spans), where an exception would tell the user a committed
        transaction failed. A span processor, sampler or exporter that raises (the SDK passes
        their errors on) costs the span, logged at DEBUG, never the transaction; the block's
        own exceptions pass through untouched. None when the span could not start."""
        try:
            manager = self.tracer.start_as_current_span(name, **options)
            opened = manager.__enter__()
        except Exception:
            log.debug("tracing: span %s could not start", name, exc_info=True)
            yield None
            return
        try:
            yield opened
        except BaseException as err:
            _exit(manager, err)
            raise
        _exit(manager, None)

    # -- reading a context back ------------------------------------------------------------

    def context_of(self, headers: RawHeaders | None) -> Context:
        """The context the global propagator reads from a record's headers (one without a
        span when they carry none)."""
        carrier: dict[str, str] = {}
        for name, value in headers or ():
            # the first value of a name, as OpenTelemetry's own getter reads it (a client
            # instrumented by opentelemetry-instrument may have appended another)
            if value is not None and name not in carrier:
                carrier[name] = (
                    value.decode(errors="replace") if isinstance(value, bytes) else value
                )
        try:
            return self._propagate.extract(carrier)
        except Exception:
            log.debug("tracing: the propagator failed to extract", exc_info=True)
            return self._propagate.extract({})

    def span_context_of(self, headers: RawHeaders | None) -> SpanContext | None:
        """The producer span's context in a record's headers; None when there is none."""
        found = self._trace.get_current_span(self.context_of(headers)).get_span_context()
        return found if found.is_valid else None

    def span_contexts(self, records: Iterable[HalfMessage]) -> list[SpanContext]:
        """The distinct producer span contexts of a transaction's messages, in order: usually
        one (one send), one per send when the transaction sent several times."""
        fields = self._propagate.get_global_textmap().fields
        seen: set[tuple[tuple[str, bytes], ...]] = set()
        found: list[SpanContext] = []
        for message in records:
            carried = tuple(h for h in message.headers if h[0] in fields)
            if not carried or carried in seen:
                continue
            seen.add(carried)
            context = self.span_context_of(carried)
            if context is not None:
                found.append(context)
        return found


#: The API once :func:`load` found it; None before, or when it is not installed.
otel: Otel | None = None
_loaded = False


def load() -> Otel | None:
    """Import the OpenTelemetry API once, if it is installed; what :data:`otel` then holds.

    Called when a producer, relay or checker is made, not when :mod:`outbox` is imported: a
    process that only migrates or runs the CLI never imports it.
    """
    global otel, _loaded
    if not _loaded:
        try:
            otel = Otel()
        except ImportError:
            otel = None
        _loaded = True
    return otel


def use_tracer_provider(provider: TracerProvider | None) -> None:
    """Record the outbox's spans (producer, relay, checker, :func:`consuming`) with
    ``provider`` instead of the global tracer provider; None goes back to the global one.

    The global provider (``opentelemetry.trace.set_tracer_provider``, or what
    ``opentelemetry-instrument`` configures) is what applications normally use; this is for an
    application that keeps several, and for tests.

    Raises:
        ConfigurationError: the OpenTelemetry API is not installed.
    """
    found = load()
    if found is None:
        raise ConfigurationError(
            "opentelemetry-api is not installed; install kafka-outbox[tracing] to trace"
        )
    found.use(provider)


# -- consumers ----------------------------------------------------------------------------


def extract_context(message: KafkaRecord | RawHeaders | None) -> Context | None:
    """The OpenTelemetry context a promoted record carries: its producer's ``outbox.send`` span.

    Pass it as ``context=`` to your tracer's ``start_as_current_span`` to make your span its
    child (:func:`consuming` does that for you). ``message`` is a ``confluent_kafka.Message`` or
    its headers. A record without trace headers gives a context with no span (your span is then
    a root, as OpenTelemetry's own Kafka instrumentation does); None only when the
    OpenTelemetry API is not installed.
    """
    found = load()
    if found is None:
        return None
    return found.context_of(message.headers() if isinstance(message, KafkaRecord) else message)


@contextmanager
def consuming(
    message: KafkaRecord,
    *,
    name: str | None = None,
    consumer_group: str | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> Iterator[Span | None]:
    """A CONSUMER span for handling ``message``, current for the block, as the child of the
    producer's span the record carries: the same trace as the request that sent it.

    ::

        for msg in consume_ready(consumer, 100, 1.0):  # outbox.reading
            with outbox.tracing.consuming(msg, consumer_group="billing"):
                handle(msg)

    The span is named ``process <topic>`` unless ``name`` is given and carries the record's
    topic, partition and offset, and its ``outbox-txn-id``, ``outbox-producer-group`` and
    ``outbox-message-index``. An exception raised in the block is recorded on it. Yields the
    span, or None when the OpenTelemetry API is not installed (the block runs all the same).
    """
    found = load()
    if found is None:
        yield None
        return
    headers = message.headers() or []
    topic = message.topic() or ""
    values: Attributes = {
        MESSAGING_SYSTEM: "kafka",
        OPERATION_TYPE: "process",
        OPERATION_NAME: "process",
        DESTINATION: topic,
    }
    partition, offset = message.partition(), message.offset()
    if partition is not None:
        values[DESTINATION_PARTITION] = str(partition)
    if offset is not None:
        values[KAFKA_OFFSET] = offset
    if consumer_group is not None:
        values[CONSUMER_GROUP] = consumer_group
    values.update(_promoted_attributes(headers))
    values.update(attributes or {})
    with found.tracer.start_as_current_span(
        name or f"process {topic}",
        context=found.context_of(headers),
        kind=found.CONSUMER,
        attributes=values,
    ) as span:
        yield span


# -- helpers ------------------------------------------------------------------------------


def _exit(manager: Any, err: BaseException | None) -> None:
    """Close a span's context manager; its own failure is logged, never raised (the block's
    exception, which it re-raises, goes on from the caller)."""
    try:
        if err is None:
            manager.__exit__(None, None, None)
        else:
            manager.__exit__(type(err), err, err.__traceback__)
    except BaseException as failed:
        if failed is not err:
            log.debug("tracing: a span could not end", exc_info=True)


def _quietly(span: Span | None, method: str, *args: Any) -> None:
    """``span.method(*args)`` if there is a span, a failure logged at DEBUG."""
    if span is None:
        return
    try:
        getattr(span, method)(*args)
    except Exception:
        log.debug("tracing: span.%s failed", method, exc_info=True)


def _with_headers(message: HalfMessage, extra: tuple[tuple[str, bytes], ...]) -> HalfMessage:
    if message.headers:
        own = {name.lower() for name, _ in message.headers}
        extra = tuple(h for h in extra if h[0].lower() not in own)
        if not extra:
            return message
    return HalfMessage(message.topic, message.value, message.key, message.headers + extra)


def _txn_attributes(txn: OutboxTransaction) -> Attributes:
    return {
        TRANSACTION_ID: txn.txn_id,
        PRODUCER_GROUP: txn.producer.settings.producer_group,
    }


def _send_span(txn: OutboxTransaction, messages: Sequence[HalfMessage]) -> tuple[str, Attributes]:
    """The span name and attributes of one half send: ``outbox.send`` for one message,
    ``outbox.send_batch`` for several."""
    attributes = _txn_attributes(txn)
    attributes[MESSAGING_SYSTEM] = "kafka"
    attributes[OPERATION_TYPE] = "send"
    attributes[OPERATION_NAME] = "send"
    topics = sorted({m.topic for m in messages})
    if len(topics) == 1:
        attributes[DESTINATION] = topics[0]
    else:
        attributes[DESTINATIONS] = topics
    if len(messages) == 1:
        return SEND, attributes
    attributes[BATCH_COUNT] = len(messages)
    return SEND_BATCH, attributes


def _sent(span: Span | None, coordinates: HalfCoordinates, sent: int) -> None:
    _quietly(span, "set_attribute", HALF_PARTITION, coordinates.partition)
    _quietly(span, "set_attribute", HALF_OFFSET, coordinates.offsets[-sent])


def _op_attributes(op: OpRecord) -> Attributes:
    return {
        TRANSACTION_ID: op.txn_id,
        PRODUCER_GROUP: op.producer_group,
        OP_STATE: op.state.value,
        HALF_PARTITION: op.half_partition,
    }


_PROMOTED = {
    Header.TXN_ID.value: TRANSACTION_ID,
    Header.PRODUCER_GROUP.value: PRODUCER_GROUP,
}


def _promoted_attributes(headers: Iterable[tuple[str, bytes]]) -> Attributes:
    """The transaction a promoted record belongs to, from the headers the relay adds."""
    found: Attributes = {}
    for name, value in headers:
        if name in _PROMOTED and value is not None:
            found[_PROMOTED[name]] = value.decode(errors="replace")
        elif name == Header.MESSAGE_INDEX.value and value is not None and value.isdigit():
            found[MESSAGE_INDEX] = int(value)
    return found

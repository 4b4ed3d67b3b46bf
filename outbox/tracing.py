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
The spans are made by :class:`outbox.otel.Otel`; their names and attributes are in
:mod:`outbox.span_attributes` (re-exported here). docs/tracing.md says what each span carries
and what it costs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from outbox.errors import ConfigurationError
from outbox.otel import Otel
from outbox.protocol.headers import Header
from outbox.span_attributes import (
    BATCH_COUNT,
    COMMIT,
    CONSUMER_GROUP,
    DESTINATION,
    DESTINATION_PARTITION,
    DESTINATIONS,
    EXECUTE,
    HALF_OFFSET,
    HALF_PARTITION,
    KAFKA_OFFSET,
    LOCAL_STATE,
    MESSAGE_INDEX,
    MESSAGING_SYSTEM,
    OP,
    OP_STATE,
    OP_WRITTEN,
    OPERATION_NAME,
    OPERATION_TYPE,
    PRODUCER_GROUP,
    SCOPE,
    SEND,
    SEND_BATCH,
    TRANSACTION_ID,
    Attributes,
    RawHeaders,
)

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, TracerProvider
    from opentelemetry.util.types import AttributeValue

__all__ = [
    "BATCH_COUNT",
    "COMMIT",
    "CONSUMER_GROUP",
    "DESTINATION",
    "DESTINATIONS",
    "DESTINATION_PARTITION",
    "EXECUTE",
    "HALF_OFFSET",
    "HALF_PARTITION",
    "KAFKA_OFFSET",
    "LOCAL_STATE",
    "MESSAGE_INDEX",
    "MESSAGING_SYSTEM",
    "OP",
    "OPERATION_NAME",
    "OPERATION_TYPE",
    "OP_STATE",
    "OP_WRITTEN",
    "PRODUCER_GROUP",
    "SCOPE",
    "SEND",
    "SEND_BATCH",
    "TRANSACTION_ID",
    "Attributes",
    "KafkaRecord",
    "Otel",
    "RawHeaders",
    "consuming",
    "extract_context",
    "load",
    "otel",
    "use_tracer_provider",
]


@runtime_checkable
class KafkaRecord(Protocol):
    """What :func:`consuming` reads of a record (a ``confluent_kafka.Message`` is one)."""

    def headers(self) -> list[tuple[str, bytes]] | None: ...
    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...


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

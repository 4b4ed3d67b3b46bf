"""The OpenTelemetry API as the outbox uses it: the spans around a half send, the local
COMMIT, a listener's local transaction and the op record, and reading a trace context back from
a record's headers (for the relay's and the checker's links).

Made only by :func:`outbox.tracing.load`, once the API imports; every span here is started so
that tracing can never fail the work it watches (:meth:`Otel.span`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from outbox.protocol.half import HalfMessage
from outbox.protocol.headers import RESERVED_HEADER_PREFIX
from outbox.span_attributes import (
    COMMIT,
    EXECUTE,
    HALF_OFFSET,
    HALF_PARTITION,
    LOCAL_STATE,
    OP,
    OP_WRITTEN,
    SCOPE,
    RawHeaders,
    op_attributes,
    send_span,
    txn_attributes,
)

log = logging.getLogger("outbox.tracing")

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, SpanContext, TracerProvider

    from outbox.protocol.op import OpRecord
    from outbox.protocol.states import LocalTransactionState
    from outbox.transaction import HalfCoordinates, OutboxTransaction


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

        Until an SDK is configured (or :func:`outbox.tracing.use_tracer_provider` named one),
        the API's spans record nothing, and the context a send carries is the caller's whether a
        span is started or not: the producer's spans are skipped then, which saves the hot path
        some 6 us per send (of 12; docs/tracing.md, "Cost"), and the caller's context still
        goes on.
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
        name, attributes = send_span(txn, messages)
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
        name, attributes = send_span(txn, messages)
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
        with self.span(COMMIT, attributes=txn_attributes(txn)):
            commit()

    async def commit_async(
        self, txn: OutboxTransaction, commit: Callable[[], Awaitable[None]]
    ) -> None:
        """:meth:`commit`, awaited."""
        if not self.configured():
            return await commit()
        with self.span(COMMIT, attributes=txn_attributes(txn)):
            await commit()

    def execute(
        self, txn: OutboxTransaction, execute: Callable[[], LocalTransactionState]
    ) -> LocalTransactionState:
        """A ``TransactionalProducer`` listener's local transaction in its span."""
        if not self.configured():
            return execute()
        with self.span(EXECUTE, attributes=txn_attributes(txn)) as span:
            state = execute()
            _quietly(span, "set_attribute", LOCAL_STATE, state.value)
            return state

    async def execute_async(
        self, txn: OutboxTransaction, execute: Callable[[], Awaitable[LocalTransactionState]]
    ) -> LocalTransactionState:
        """:meth:`execute`, awaited."""
        if not self.configured():
            return await execute()
        with self.span(EXECUTE, attributes=txn_attributes(txn)) as span:
            state = await execute()
            _quietly(span, "set_attribute", LOCAL_STATE, state.value)
            return state

    def op(self, op: OpRecord, send: Callable[[OpRecord], bool]) -> bool:
        """The op record's send in an ``outbox.op`` span; a lost op marks it failed."""
        if not self.configured():
            return send(op)
        with self.span(OP, attributes=op_attributes(op)) as span:
            written = send(op)
            self._op_sent(span, written)
            return written

    async def op_async(self, op: OpRecord, send: Callable[[OpRecord], Awaitable[bool]]) -> bool:
        """:meth:`op`, awaited."""
        if not self.configured():
            return await send(op)
        with self.span(OP, attributes=op_attributes(op)) as span:
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


def _sent(span: Span | None, coordinates: HalfCoordinates, sent: int) -> None:
    _quietly(span, "set_attribute", HALF_PARTITION, coordinates.partition)
    _quietly(span, "set_attribute", HALF_OFFSET, coordinates.offsets[-sent])

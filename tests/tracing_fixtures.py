"""Spans recorded in memory by the OpenTelemetry SDK, for tests of what the outbox traces.

The outbox's spans go to a provider of this test's own (``outbox.tracing.use_tracer_provider``),
not to the global one: OpenTelemetry lets the global provider be set once per process, and a
global SDK would go on recording the spans of every later test of the session.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from outbox import tracing

if TYPE_CHECKING:  # imported by the fixture: a test session that traces nothing loads no SDK
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import Tracer


@dataclass
class Traces:
    provider: TracerProvider
    exporter: InMemorySpanExporter

    @property
    def tracer(self) -> Tracer:
        """The application's own tracer (its request spans)."""
        return self.provider.get_tracer("tests")

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name == name]

    def one(
        self, name: str, where: Callable[[ReadableSpan], bool] = lambda s: True
    ) -> ReadableSpan:
        found = [s for s in self.named(name) if where(s)]
        assert len(found) == 1, f"{len(found)} {name} spans: {found}"
        return found[0]

    def wait(
        self, name: str, where: Callable[[ReadableSpan], bool], timeout: float = 60
    ) -> ReadableSpan:
        """The one span named ``name`` that ``where`` accepts, once some service thread ended it."""
        deadline = time.monotonic() + timeout
        while True:
            found = [s for s in self.named(name) if where(s)]
            if found:
                assert len(found) == 1, f"{len(found)} {name} spans: {found}"
                return found[0]
            assert time.monotonic() < deadline, f"no {name} span: {self.named(name)}"
            time.sleep(0.2)


@pytest.fixture
def traces() -> Iterator[Traces]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    assert tracing.load() is not None, "opentelemetry-api is a dev dependency"
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_tracer_provider(provider)
    try:
        yield Traces(provider, exporter)
    finally:
        tracing.use_tracer_provider(None)
        provider.shutdown()


def traceparent(span: ReadableSpan) -> bytes:
    """The W3C ``traceparent`` a record carries when ``span`` was current at its send."""
    context = span.get_span_context()
    assert context is not None
    return w3c(context.trace_id, context.span_id, int(context.trace_flags))


def w3c(trace_id: int, span_id: int, flags: int) -> bytes:
    return f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}".encode()

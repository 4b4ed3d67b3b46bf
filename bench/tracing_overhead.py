"""What tracing costs the producer's hot path: ``outbox.send`` with and without OpenTelemetry.

::

    python -m bench.tracing_overhead                    # starts a broker as the tests do
    python -m bench.tracing_overhead --bootstrap localhost:9092 --rounds 5

Three modes, each in a process of its own, interleaved round by round (each going first in
turn) so a noisy machine disturbs them alike:

- ``absent``: ``import opentelemetry`` fails (``sys.modules['opentelemetry'] = None``), as
  where the API is not installed: the hot path is one ``is None`` check;
- ``api``: the API installed, no SDK configured (what a FastAPI application has: FastAPI
  depends on the API): non-recording spans, nothing injected;
- ``sdk``: an SDK ``TracerProvider`` with a ``BatchSpanProcessor`` and an exporter that drops
  what it is given, the sends inside a request span: every span recorded, every half record
  carrying a ``traceparent``.

Two figures each: ``txn.send()`` against a stand-in for Kafka that acknowledges at once, in
transactions of 100 sends (the outbox's own CPU per send, where tracing's share is largest),
and 2,000 ``outbox.send`` calls in one transaction against a real broker and SQLite (what an
application sees). Nothing here
asserts a timing; docs/tracing.md quotes a run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from typing import Any

MODES = ("absent", "api", "sdk")


def child(mode: str, bootstrap: str, sends: int, micro_sends: int) -> dict[str, Any]:
    """One mode's figures, measured in this process (see the module docstring)."""
    if mode == "absent":
        sys.modules["opentelemetry"] = None  # type: ignore[assignment]
    import sqlalchemy as sa
    from sqlalchemy.orm import sessionmaker

    import outbox
    from outbox import OutboxProducer, OutboxSettings, ensure_topics, migrations, tracing
    from outbox.transaction import OutboxTransaction

    request = _configure(mode)
    loaded = tracing.load()
    assert (loaded is None) == (mode == "absent"), mode

    class Acknowledging:
        """Kafka that acknowledges every half record at once."""

        def send_halves(self, batch: Any, meanwhile: Any = None) -> list[int]:
            start = batch.first_index
            return list(range(start, start + len(batch.messages)))

        def send_op(self, op: Any) -> bool:
            return True

    class Host:
        settings = OutboxSettings(bootstrap_servers="localhost:9", producer_group="bench")
        serializer = None
        kafka = Acknowledging()
        partitions = 3
        known_partitions = 3

    micro = []
    host = Host()
    with request():
        for _ in range(5):
            started = time.perf_counter()
            # transactions of 100 sends: a send's coordinates copy the transaction's offsets so
            # far, which in one transaction of 20,000 would be most of what is measured
            for _ in range(micro_sends // 100):
                txn = OutboxTransaction(host)  # type: ignore[arg-type]
                for _ in range(100):
                    txn.send("orders", b"value", key=b"order-1")
            micro.append((time.perf_counter() - started) / micro_sends * 1e6)
    prefix = f"__bench-tracing-{uuid.uuid4().hex[:8]}"
    settings = OutboxSettings(
        bootstrap_servers=bootstrap, producer_group="bench", topic_prefix=prefix, partitions=3
    )
    ensure_topics(settings)
    folder = tempfile.mkdtemp(prefix="bench-tracing-")
    url = f"sqlite:///{folder}/bench.db"
    migrations.upgrade(url)
    engine = sa.create_engine(url)
    real = []
    with OutboxProducer(settings) as producer, request():
        with producer.transaction(sessionmaker(engine)):  # warm-up: connections, metadata
            outbox.send("orders", b"value", key=b"order-1")
        for _ in range(2):
            started = time.perf_counter()
            with producer.transaction(sessionmaker(engine)):
                for _ in range(sends):
                    outbox.send("orders", b"value", key=b"order-1")
            real.append(time.perf_counter() - started)
    engine.dispose()
    return {"mode": mode, "micro_us": min(micro), "real_s": min(real)}


def _configure(mode: str) -> Any:
    """The request span the sends run in (``sdk``), after configuring the SDK; else none."""
    from contextlib import nullcontext

    if mode != "sdk":
        return nullcontext
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Dropping(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropping()))
    trace.set_tracer_provider(provider)
    tracer = trace.get_tracer("bench")
    return lambda: tracer.start_as_current_span("request")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", help="a running broker (default: start one)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sends", type=int, default=2000)
    parser.add_argument("--micro-sends", type=int, default=20000)
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.bootstrap, args.sends, args.micro_sends)))
        return
    service = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        from outbox.testing import start_kafka

        service = start_kafka()
        bootstrap = service.address
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    try:
        for round_ in range(args.rounds):
            shift = round_ % len(MODES)  # each mode goes first as often: no order bias
            for mode in MODES[shift:] + MODES[:shift]:
                command = [sys.executable, "-m", "bench.tracing_overhead", "--child", mode]
                command += ["--bootstrap", bootstrap, "--sends", str(args.sends)]
                command += ["--micro-sends", str(args.micro_sends)]
                out = subprocess.run(
                    command,
                    capture_output=True,
                    text=True,
                    check=True,
                    env=os.environ,
                )
                results[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    finally:
        if service is not None:
            service.stop()
    print(f"{args.rounds} rounds, median of each round's best; {os.cpu_count()} cores")
    print(f"{'mode':8} {'us/send (stand-in Kafka)':>26} {f'{args.sends} sends, real broker':>26}")
    for mode in MODES:
        micro = statistics.median(r["micro_us"] for r in results[mode])
        real = statistics.median(r["real_s"] for r in results[mode])
        print(f"{mode:8} {micro:26.2f} {real:24.3f} s")


if __name__ == "__main__":
    main()

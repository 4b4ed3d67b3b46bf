"""Scenario 1, the producer path: committed transactions/s and latency of one transaction.

For each database, thread count and messages per transaction:

- **ours**: the real ``@outbox.transactional`` path, written as the README advises: the half
  records first (``outbox.send()``, or ``outbox.send_batch()`` for several: sent and
  acknowledged, the evidence row written), then the business write, DB commit, COMMIT op
  (one-way). Sending first keeps the business rows locked only for the local work, not for a
  Kafka round trip. Threads share one ``OutboxProducer``, as a service's would.
- **baseline A**: the same business write, commit, then a synchronous idempotent produce.
- **protocol floor**: A plus the evidence row and a one-way op record (:mod:`bench.floor`): A's
  serial shape with the protocol's two records added, none of ours' machinery. One message per
  transaction only (the targets' shape).
- **baseline B**: the same business write plus one ``outbox_messages`` row per message, in the
  same DB transaction (no relay runs meanwhile; its cost is the relay path's).

Every configuration warms each impl up, then runs ``runs`` rounds of one timed run of each impl,
the impls' order balanced over the rounds (:func:`bench.model.round_orders`), so a slow spell
of the machine falls on every impl's runs alike (:func:`bench.model.repeat_interleaved`);
every run starts from empty tables.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

import outbox
from bench.baselines import SyncProducer, create_outbox_table, place_order_a, place_order_b
from bench.config import BenchConfig
from bench.floor import OneWayProducer, place_order_floor
from bench.load import LoadResult, closed_loop
from bench.model import Row, ScenarioResult, repeat_interleaved
from bench.procs import Context, create_topic, unique
from bench.services import Services, engine_for
from bench.workload import CUSTOMER_KEYS, PAYLOAD, business_write, clear, create_schema
from outbox import OutboxProducer, OutboxSettings, ensure_topics, migrations
from outbox.closing import close_each

log = logging.getLogger("bench")

IMPLS = ("ours", "protocol_floor", "baseline_a", "baseline_b")
UNITS = {"txn_per_s": "txn/s", "p50_ms": "ms", "p99_ms": "ms", "errors": "count"}
COLUMNS = {"txn_per_s": "txn/s", "p50_ms": "p50 ms", "p99_ms": "p99 ms", "errors": "errors"}
TABLES = ["bench_orders", "outbox_evidence", "outbox_messages"]


def outbox_settings(bootstrap: str, prefix: str, **extra: Any) -> OutboxSettings:
    """The producer's settings in every scenario: defaults, 6 partitions, group ``bench``."""
    return OutboxSettings(
        bootstrap_servers=bootstrap, producer_group="bench", topic_prefix=prefix, **extra
    )


def ours(producer: OutboxProducer, factory: Callable[[], Session], topic: str) -> Any:
    """The example service's transaction, decorated as a user would."""

    @outbox.transactional(producer=producer, session_factory=factory)
    def place_order(customer: int, messages: int, *, session: Session) -> None:
        key = CUSTOMER_KEYS[customer]
        if messages == 1:
            outbox.send(topic, PAYLOAD, key=key)
        else:
            outbox.send_batch([outbox.Message(topic, PAYLOAD, key) for _ in range(messages)])
        business_write(session, customer)

    return place_order


class ProducerBench:
    """One database with the business tables, the evidence and outbox tables, and producers."""

    def __init__(self, services: Services, db: str) -> None:
        self.db = db
        self.url = services.database(db, "producer")
        migrations.upgrade(self.url)
        setup = engine_for(self.url)
        create_schema(setup)
        create_outbox_table(setup)
        setup.dispose()
        self.settings = outbox_settings(services.bootstrap, unique("__outbox-producer"))
        ensure_topics(self.settings)
        self.topic = unique("bench-orders")
        create_topic(services.bootstrap, self.topic)
        self.producer = OutboxProducer(self.settings)
        self.sync = SyncProducer(services.bootstrap)
        self.one_way = OneWayProducer(services.bootstrap)

    def transaction(
        self, impl: str, factory: sessionmaker[Session], messages: int
    ) -> Callable[[int], None]:
        """One business transaction of ``impl`` for a customer."""
        if impl == "ours":
            place = ours(self.producer, factory, self.topic)

            def txn(customer: int) -> None:
                place(customer, messages)

        elif impl == "protocol_floor":
            op_topic = self.settings.topics.op

            def txn(customer: int) -> None:
                place_order_floor(
                    factory, self.sync, self.one_way, self.topic, op_topic, customer, messages
                )

        elif impl == "baseline_a":

            def txn(customer: int) -> None:
                place_order_a(factory, self.sync, self.topic, customer, messages)

        else:

            def txn(customer: int) -> None:
                place_order_b(factory, self.topic, customer, messages)

        return txn

    def close(self) -> None:
        closers = [self.producer.close, self.sync.close, self.one_way.close]
        close_each(closers, log, what="the producer path's producers")


def measure(
    bench: ProducerBench,
    impls: list[str],
    workers: int,
    messages: int,
    config: BenchConfig,
    profiles: list[Any] | None,
) -> list[Row]:
    """One configuration of every impl in ``impls``, their runs interleaved
    (:func:`bench.model.repeat_interleaved`): the targets are ratios of these rows."""
    engines = {impl: engine_for(bench.url, pool_size=workers) for impl in impls}
    runs: dict[str, list[LoadResult]] = {impl: [] for impl in impls}
    txns = {impl: bench.transaction(impl, sessionmaker(engines[impl]), messages) for impl in impls}

    def timed(impl: str) -> Callable[[], dict[str, float]]:
        def run() -> dict[str, float]:
            load = closed_loop(
                txns[impl], workers=workers, seconds=config.seconds, profile=profiles is not None
            )
            runs[impl].append(load)
            if profiles is not None:
                profiles.extend(load.profiles)
            return load.figures()

        return run

    def warmup(impl: str) -> Callable[[], object]:
        return lambda: closed_loop(txns[impl], workers=workers, seconds=config.warmup_seconds)

    setup = engine_for(bench.url)
    try:
        metrics = repeat_interleaved(
            {impl: timed(impl) for impl in impls},
            runs=config.runs,
            units=UNITS,
            warmups={impl: warmup(impl) for impl in impls},
            # each run from the same state: empty tables, whichever impl ran before it
            before_each=lambda: clear(setup, TABLES),
        )
    finally:
        close_each([setup.dispose, *(e.dispose for e in engines.values())], log, what="the engines")
    return [
        Row(
            {"impl": impl, "db": bench.db, "workers": workers, "messages": messages},
            metrics[impl],
            {**run_info(runs[impl]), "interleaved": True},
        )
        for impl in impls
    ]


def run_info(runs: list[LoadResult]) -> dict[str, Any]:
    """What a row keeps beside its figures: completions per run, the first error."""
    info: dict[str, Any] = {"transactions_per_run": [r.completed for r in runs]}
    errors = [r.first_error for r in runs if r.first_error]
    if errors:
        info["first_error"] = errors[0]
    return info


def run(
    services: Services, config: BenchConfig, ctx: Context, *, profile: bool = False
) -> ScenarioResult:
    started = time.monotonic()
    result = ScenarioResult(
        "producer",
        "Producer path: committed transactions/s and latency of one transaction",
        keys=["impl", "db", "workers", "messages"],
        columns=COLUMNS,
    )
    profiles: list[Any] | None = [] if profile else None
    for db in config.databases:
        bench = ProducerBench(services, db)
        try:
            for workers in config.workers:
                for messages in config.messages:
                    impls = [
                        i for i in IMPLS if i in config.impls and messages in _messages(i, config)
                    ]
                    if not impls:
                        continue
                    for row in measure(bench, impls, workers, messages, config, profiles):
                        result.rows.append(row)
                        _progress(row)
        finally:
            bench.close()
    # the tables read impl by impl, as before the runs were interleaved
    result.rows.sort(
        key=lambda row: (config.databases.index(row.config["db"]), IMPLS.index(row.config["impl"]))
    )
    result.notes.append(
        "Threads share one producer and one connection pool sized to the threads; each "
        "transaction is one small UPDATE and one 1 KiB INSERT plus 1 KiB messages. Baseline B's "
        "relay is not running during this scenario (see the relay path). protocol_floor is "
        "baseline A plus the evidence row and a one-way op record (bench/floor.py), one message "
        "per transaction: A's serial shape with the protocol's two records added, without ours' "
        "machinery. The impls' runs of a configuration are interleaved (each round runs every "
        "impl once, in an order balanced over the rounds), every run from empty tables."
    )
    if profiles:
        write_thread_profiles(profiles, ctx, "producer-workers")
    result.seconds = time.monotonic() - started
    return result


def _messages(impl: str, config: BenchConfig) -> tuple[int, ...]:
    """The floor runs the targets' shape only (one message per transaction)."""
    if impl == "protocol_floor":
        return tuple(m for m in config.messages if m == 1)
    return config.messages


def write_thread_profiles(profiles: list[Any], ctx: Context, name: str) -> None:
    """The worker threads' pyinstrument sessions, combined, as HTML and text."""
    from pyinstrument.renderers import ConsoleRenderer, HTMLRenderer
    from pyinstrument.session import Session as ProfileSession

    # Each thread's samples hang under its own thread frame; put them under one, so the
    # profile reads as "where the workers' time goes" rather than one tree per thread.
    merged = "bench-workers\x00<thread>\x000"
    for session in profiles:
        session.frame_records = [
            ([merged, *stack[1:]] if stack and "\x00<thread>\x00" in stack[0] else stack, t)
            for stack, t in session.frame_records
        ]
    combined = functools.reduce(ProfileSession.combine, profiles)
    folder = ctx.folder / "profile"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.html").write_text(HTMLRenderer().render(combined))
    text = ConsoleRenderer(unicode=True, color=False, show_all=False).render(combined)
    (folder / f"{name}.txt").write_text(text)


def _progress(row: Row) -> None:
    c, m = row.config, row.metrics
    print(
        f"  producer {c['impl']:<14} {c['db']:<10} workers={c['workers']:<3} "
        f"messages={c['messages']:<3} {m['txn_per_s'].median:>9,.0f} txn/s  "
        f"p50 {m['p50_ms'].median:6.1f} ms  p99 {m['p99_ms'].median:6.1f} ms  "
        f"errors {m['errors'].median:.0f}",
        flush=True,
    )

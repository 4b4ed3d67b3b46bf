"""Scenario 1b, the asyncio producer path: committed transactions/s and latency of tasks in one
event loop, on SQLAlchemy's AsyncSession (psycopg's async mode, aiosqlite).

- **ours**: ``async def`` under ``@outbox.transactional``, written as the README advises: ``await
  outbox.send()`` first (acknowledged, the evidence row written), then the business write, DB
  commit, COMMIT op (one-way). Tasks share one ``OutboxProducer``.
- **baseline A (async)**: the same business write, commit, then a produce whose
  acknowledgement is awaited as a future (the delivery callback completes it on the loop): an
  asyncio service's commit-then-publish, with nothing in between.
- **protocol floor (async)**: A with the evidence row in its DB transaction (written as ours
  writes it on an AsyncSession) and a one-way op record after the publish (:mod:`bench.floor`).

The workload is the producer path's (:mod:`bench.workload`); only the waiting is asyncio. Tasks
run a closed loop in one loop, as requests of one uvicorn worker would. The impls' runs are
interleaved, as in the producer path.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable

from confluent_kafka import KafkaError, Message
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

import outbox
from bench.baselines import SyncProducer, create_outbox_table
from bench.config import BenchConfig
from bench.floor import GROUP, OneWayProducer, committed
from bench.load import LoadResult
from bench.model import Row, ScenarioResult, repeat_interleaved
from bench.procs import Context, create_topic, unique
from bench.producer_path import COLUMNS, TABLES, UNITS, outbox_settings, run_info
from bench.services import Services, async_engine_for, engine_for
from bench.workload import (
    CUSTOMER_KEYS,
    PAYLOAD,
    business_write_async,
    clear,
    create_schema,
)
from outbox import OutboxProducer, ensure_topics, migrations
from outbox.closing import close_each
from outbox.evidence import write_evidence
from outbox.protocol.ids import new_transaction_id

log = logging.getLogger("bench")

IMPLS = ("ours", "protocol_floor", "baseline_a")
Transaction = Callable[[int], Awaitable[None]]


class AsyncPublisher(SyncProducer):
    """Baseline A's producer for asyncio: produce, and await the acknowledgement as a future."""

    async def send_async(self, topic: str, value: bytes, key: bytes) -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[KafkaError | None] = loop.create_future()

        def delivered(err: KafkaError | None, msg: Message) -> None:
            loop.call_soon_threadsafe(done.set_result, err)

        self._producer.produce(topic, value=value, key=key, on_delivery=delivered)
        err = await asyncio.wait_for(done, 30)
        if err is not None:
            raise RuntimeError(f"not acknowledged: {err.str()}")


def transaction(
    impl: str,
    factory: async_sessionmaker[AsyncSession],
    producer: OutboxProducer,
    publisher: AsyncPublisher,
    topic: str,
    ops: OneWayProducer,
) -> Transaction:
    if impl == "ours":

        @outbox.transactional(producer=producer, session_factory=factory)
        async def place_order(customer: int, *, session: AsyncSession) -> None:
            await outbox.send(topic, PAYLOAD, key=CUSTOMER_KEYS[customer])
            await business_write_async(session, customer)

        return place_order  # type: ignore[return-value]

    if impl == "protocol_floor":
        op_topic = producer.settings.topics.op

        async def place_order_floor(customer: int) -> None:
            txn_id = new_transaction_id()
            async with factory() as session, session.begin():
                await business_write_async(session, customer)
                await session.run_sync(write_evidence, txn_id, GROUP)
            await publisher.send_async(topic, PAYLOAD, CUSTOMER_KEYS[customer])
            ops.send_one_way(op_topic, *committed(txn_id, 1))

        return place_order_floor

    async def place_order_a(customer: int) -> None:
        async with factory() as session, session.begin():
            await business_write_async(session, customer)
        await publisher.send_async(topic, PAYLOAD, CUSTOMER_KEYS[customer])

    return place_order_a


async def closed_loop(txn: Transaction, *, tasks: int, seconds: float) -> LoadResult:
    """Run ``txn`` from ``tasks`` tasks of this loop for ``seconds``; every completion counted."""
    result = LoadResult(0, 0, 0.0, [])
    deadline = time.perf_counter() + seconds

    async def task(index: int) -> None:
        rng = random.Random(1000 + index)
        while time.perf_counter() < deadline:
            customer = rng.randint(1, 100)
            began = time.perf_counter()
            try:
                await txn(customer)
            except Exception as err:
                result.errors += 1
                result.first_error = result.first_error or repr(err)
                continue
            result.latencies_ms.append((time.perf_counter() - began) * 1000)
            result.completed += 1

    started = time.perf_counter()
    await asyncio.gather(*(task(i) for i in range(tasks)))
    result.elapsed_s = time.perf_counter() - started
    return result


def measure(
    services: Services, db: str, url: str, impls: list[str], tasks: int, config: BenchConfig
) -> list[Row]:
    """One task count of every impl in ``impls``, their runs interleaved
    (:func:`bench.model.repeat_interleaved`), each from empty tables."""
    settings = outbox_settings(services.bootstrap, unique("__outbox-async"))
    ensure_topics(settings)
    topic = unique("bench-orders-async")
    create_topic(services.bootstrap, topic)
    producer = OutboxProducer(settings)
    publisher = AsyncPublisher(services.bootstrap)
    ops = OneWayProducer(services.bootstrap)
    runs: dict[str, list[LoadResult]] = {impl: [] for impl in impls}

    async def timed_run(impl: str, seconds: float) -> LoadResult:
        engine = async_engine_for(url, pool_size=tasks)
        try:
            factory = async_sessionmaker(engine, expire_on_commit=False)
            txn = transaction(impl, factory, producer, publisher, topic, ops)
            return await closed_loop(txn, tasks=tasks, seconds=seconds)
        finally:
            await engine.dispose()

    def timed(impl: str) -> Callable[[], dict[str, float]]:
        def run() -> dict[str, float]:
            load = asyncio.run(timed_run(impl, config.seconds))
            runs[impl].append(load)
            return load.figures()

        return run

    def warmup(impl: str) -> Callable[[], object]:
        return lambda: asyncio.run(timed_run(impl, config.warmup_seconds))

    setup = engine_for(url)
    try:
        metrics = repeat_interleaved(
            {impl: timed(impl) for impl in impls},
            runs=config.runs,
            units=UNITS,
            warmups={impl: warmup(impl) for impl in impls},
            before_each=lambda: clear(setup, TABLES),
        )
    finally:
        close_each(
            [setup.dispose, producer.close, publisher.close, ops.close],
            log,
            what="the asyncio producers",
        )
    return [
        Row(
            {"impl": impl, "db": db, "tasks": tasks},
            metrics[impl],
            {**run_info(runs[impl]), "interleaved": True},
        )
        for impl in impls
    ]


def run(services: Services, config: BenchConfig, ctx: Context) -> ScenarioResult:
    started = time.monotonic()
    result = ScenarioResult(
        "producer_async",
        "asyncio producer path: committed transactions/s and latency, tasks in one event loop",
        keys=["impl", "db", "tasks"],
        columns=COLUMNS,
    )
    impls = [i for i in IMPLS if i in config.impls]
    for db in config.databases if impls else ():
        url = services.database(db, "producer_async")
        migrations.upgrade(url)
        setup = engine_for(url)
        create_schema(setup)
        create_outbox_table(setup)
        setup.dispose()
        for tasks in config.workers:
            for row in measure(services, db, url, impls, tasks, config):
                result.rows.append(row)
                _progress(row)
    # the tables read impl by impl, as before the runs were interleaved
    result.rows.sort(
        key=lambda row: (
            config.databases.index(row.config["db"]),
            IMPLS.index(row.config["impl"]),
        )
    )
    result.notes.append(
        "Tasks of one event loop share one producer and one AsyncEngine pool sized to the "
        "tasks; the transaction is the producer path's (one UPDATE, one 1 KiB INSERT, one 1 KiB "
        "message). Baseline A awaits its publish after the commit; protocol_floor is A with the "
        "evidence row and a one-way op record (bench/floor.py). The impls' runs of a task count "
        "are interleaved (each round runs every impl once, in an order balanced over the rounds), "
        "every run from empty tables."
    )
    result.seconds = time.monotonic() - started
    return result


def _progress(row: Row) -> None:
    c, m = row.config, row.metrics
    print(
        f"  producer_async {c['impl']:<14} {c['db']:<10} tasks={c['tasks']:<3} "
        f"{m['txn_per_s'].median:>9,.0f} txn/s  p50 {m['p50_ms'].median:6.1f} ms  "
        f"p99 {m['p99_ms'].median:6.1f} ms  errors {m['errors'].median:.0f}",
        flush=True,
    )

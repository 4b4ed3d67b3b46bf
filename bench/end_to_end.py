"""Scenario 3, end to end: commit-to-visible latency at a fixed offered load, ours vs B.

An open-loop scheduler issues transactions at the offered rate (whether or not earlier ones
have finished) to a pool of worker threads; each transaction is the producer path's business
write and one 1 KiB message carrying a ``bench-seq`` header. When its DB commit returns, the
transaction's commit time is stamped (a SQLAlchemy ``after_commit`` hook, on the monotonic
clock). One relay process (ours: ``python -m relay``; B: the polling relay at its default
interval) promotes, and a ``read_committed`` consumer in its own process stamps each record's
arrival on the same machine-wide clock. Latency = arrival - commit.

The rate the system really committed is reported beside the offered one: when it cannot keep
up, the scheduler waits for a free worker and the achieved rate shows it. How busy the machine
was while the load ran, and which process used the cores (``bench/cpu.py``), is recorded with
each run: a latency measured on a saturated machine is a queue's.
"""

from __future__ import annotations

import functools
import itertools
import os
import random
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

import outbox
from bench.baselines import create_outbox_table, place_order_b
from bench.config import BenchConfig
from bench.cpu import CpuMeter, Roles, kafka_brokers, postgres_servers
from bench.model import Row, ScenarioResult, repeat
from bench.procs import Child, Context, create_topic, holds_partitions, relay_env, unique
from bench.producer_path import outbox_settings
from bench.services import Services, engine_for
from bench.stats import percentiles
from bench.watch import Watcher
from bench.workload import CUSTOMER_KEYS, PAYLOAD, business_write, create_schema
from outbox import OutboxProducer, ensure_topics, migrations

IMPLS = ("ours", "baseline_b")
UNITS = {
    "p50_ms": "ms",
    "p99_ms": "ms",
    "max_ms": "ms",
    "achieved_per_s": "txn/s",
    "undelivered": "count",
    "errors": "count",
    "shed": "count",
    # DB commit -> the relay's produce() (the promoted record's timestamp; both wall clock)
    "to_relay_p50_ms": "ms",
    "to_relay_p99_ms": "ms",
    # where the cores went while the load ran (bench/cpu.py); only "busy" is a table column
    "cores_busy": "cores",
    "cores_generator": "cores",
    "cores_relay": "cores",
    "cores_broker": "cores",
    "cores_database": "cores",
}
COLUMNS = {
    "p50_ms": "p50 ms",
    "p99_ms": "p99 ms",
    "max_ms": "max ms",
    "achieved_per_s": "achieved txn/s",
    "undelivered": "undelivered",
    "errors": "errors",
    "shed": "not issued",
    "cores_busy": "busy cores",
}
_current = threading.local()


class Pipeline:
    """A database, one relay and a watcher for one implementation; transactions numbered."""

    def __init__(self, services: Services, ctx: Context, db: str, impl: str, config: BenchConfig):
        self.impl, self.db = impl, db
        self.url = services.database(db, "e2e")
        migrations.upgrade(self.url)
        self.engine = engine_for(self.url, pool_size=config.e2e_workers)
        create_schema(self.engine)
        create_outbox_table(self.engine)
        self.topic = unique("bench-e2e")
        create_topic(services.bootstrap, self.topic)
        self.commits: dict[str, int] = {}
        self.factory = sessionmaker(self.engine)
        sa.event.listen(self.factory, "after_commit", self._committed)
        self._seqs = itertools.count(1)
        self.producer: OutboxProducer | None = None
        if impl == "ours":
            settings = outbox_settings(services.bootstrap, unique("__outbox-e2e"))
            ensure_topics(settings)
            self.producer = OutboxProducer(settings)
            group = unique("bench-e2e-relay")
            env = relay_env(services.bootstrap, settings.topic_prefix, group, "e2e")
            self.relay = Child(ctx, f"relay-{group}", "relay", env=env)
        else:
            args = [
                "relay",
                "--db-url",
                self.url,
                "--bootstrap",
                services.bootstrap,
                "--batch",
                str(config.b_batch),
                "--poll-interval",
                str(config.poll_interval_s),
            ]
            self.relay = Child(ctx, unique("polling-relay-e2e"), "bench.baselines", args)
        self.watcher = Watcher(
            ctx,
            unique("watch-e2e"),
            services.bootstrap,
            self.topic,
            consumer=dict(item.split("=", 1) for item in config.e2e_consumer),
        )
        self.place = self._ours() if impl == "ours" else self._baseline_b

    def start(self) -> None:
        self.watcher.start()
        self.relay.start()
        if self.impl == "ours":
            self.relay.wait_for_log(holds_partitions, 60, "partition assignment")

    def _committed(self, session: Session) -> None:
        seq = getattr(_current, "seq", None)
        if seq is not None:
            self.commits[seq] = time.monotonic_ns()

    def _ours(self) -> Any:
        assert self.producer is not None

        @outbox.transactional(producer=self.producer, session_factory=self.factory)
        def place_order(customer: int, seq: str, *, session: Session) -> None:
            business_write(session, customer)
            outbox.send(
                self.topic, PAYLOAD, key=CUSTOMER_KEYS[customer], headers={"bench-seq": seq}
            )

        return place_order

    def _baseline_b(self, customer: int, seq: str) -> None:
        place_order_b(self.factory, self.topic, customer, 1, {"bench-seq": seq})

    def transaction(self, customer: int) -> str:
        seq = str(next(self._seqs))
        _current.seq = seq
        try:
            self.place(customer, seq)
        finally:
            _current.seq = None
        return seq

    def cpu_roles(self) -> Roles:
        """The processes of this pipeline's run, by role (SQLite runs inside the generator)."""

        def relay() -> list[int]:
            proc = self.relay.proc
            return [proc.pid] if proc is not None and proc.poll() is None else []

        roles: dict[str, Callable[[], Iterable[int]]] = {
            "generator": lambda: [os.getpid()],
            "relay": relay,
            "broker": kafka_brokers,
        }
        if self.db == "postgresql":
            roles["database"] = postgres_servers
        return roles

    def close(self) -> None:
        self.relay.stop()
        self.watcher.stop()
        if self.producer is not None:
            self.producer.close()
        self.engine.dispose()


def open_loop(pipeline: Pipeline, rate: float, seconds: float, workers: int) -> dict[str, Any]:
    """Issue ``rate`` transactions/s for ``seconds``; what was committed, and how fast.

    The schedule is kept in time: when every worker is busy, the scheduler waits for one, and
    what could not be issued by the end of the window is not issued at all (``shed``), so a
    run lasts ``seconds`` (plus the transactions in flight) whatever the system sustains.
    """
    total = max(1, int(rate * seconds))
    slots = threading.Semaphore(workers)
    rng = random.Random(int(rate))
    committed: list[str] = []
    errors: list[str] = []
    lock = threading.Lock()

    def task(customer: int) -> None:
        try:
            seq = pipeline.transaction(customer)
            with lock:
                committed.append(seq)
        except Exception as err:
            with lock:
                errors.append(repr(err))
        finally:
            slots.release()

    pool = ThreadPoolExecutor(workers, thread_name_prefix="bench-e2e")
    start = time.perf_counter()
    end = start + seconds
    issued = 0
    while issued < total and time.perf_counter() < end:
        due = min(total, int((time.perf_counter() - start) * rate) + 1)
        while issued < due:
            if not slots.acquire(timeout=max(0.0, end - time.perf_counter())):
                break
            pool.submit(task, rng.randint(1, 100))
            issued += 1
        delay = start + issued / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
    pool.shutdown(wait=True)
    elapsed = time.perf_counter() - start
    return {"committed": committed, "errors": errors, "elapsed": elapsed, "shed": total - issued}


def measure(pipeline: Pipeline, rate: float, seconds: float, workers: int) -> dict[str, float]:
    """One timed run: load, wait for the records to become visible, then the latencies."""
    before = pipeline.watcher.count
    meter = CpuMeter(pipeline.cpu_roles())
    meter.start()
    load = open_loop(pipeline, rate, seconds, workers)
    cores = meter.stop()
    committed: list[str] = load["committed"]
    pipeline.watcher.wait_for(before + len(committed), timeout=60, stalled_after=20)
    snapshot = pipeline.watcher.snapshot()
    arrived, produced = snapshot.first_arrival(), snapshot.first_timestamp()
    latencies = [
        (arrived[seq] - pipeline.commits[seq]) / 1e6
        for seq in committed
        if seq in arrived and seq in pipeline.commits
    ]
    p50, p99 = percentiles(latencies, (50, 99))
    # record timestamps are wall clock, commits monotonic: one offset, read right after the run
    wall_ns = time.time_ns() - time.monotonic_ns()
    commits = pipeline.commits
    to_relay = [
        produced[seq] - (commits[seq] + wall_ns) / 1e6
        for seq in committed
        if seq in produced and seq in commits
    ]
    r50, r99 = percentiles(to_relay, (50, 99))
    return {
        "p50_ms": p50,
        "p99_ms": p99,
        "max_ms": max(latencies, default=float("nan")),
        "achieved_per_s": len(committed) / load["elapsed"],
        "undelivered": float(len(committed) - len(latencies)),
        "errors": float(len(load["errors"])),
        "shed": float(load["shed"]),
        "to_relay_p50_ms": r50,
        "to_relay_p99_ms": r99,
        **{f"cores_{role}": used for role, used in cores.items()},
    }


def run(services: Services, config: BenchConfig, ctx: Context) -> ScenarioResult:
    started = time.monotonic()
    result = ScenarioResult(
        "end_to_end",
        "End to end: DB commit -> record visible to a read_committed consumer",
        keys=["impl", "db", "offered_per_s"],
        columns=COLUMNS,
    )
    for db in config.e2e_databases:
        for impl in [i for i in IMPLS if i in config.impls]:
            pipeline = Pipeline(services, ctx, db, impl, config)
            try:
                pipeline.start()
                for rate in config.loads:
                    metrics = repeat(
                        functools.partial(
                            measure, pipeline, rate, config.seconds, config.e2e_workers
                        ),
                        runs=config.runs,
                        units=UNITS,
                        warmup=functools.partial(
                            measure, pipeline, rate, config.warmup_seconds, config.e2e_workers
                        ),
                    )
                    row = Row({"impl": impl, "db": db, "offered_per_s": rate}, metrics)
                    result.rows.append(row)
                    _progress(row)
            finally:
                pipeline.close()
    result.notes.append(
        f"{config.e2e_workers} worker threads; {config.seconds:.0f} s per run; one relay process "
        f"(ours: defaults; B: polling interval {config.poll_interval_s * 1000:.0f} ms, batches of "
        f"{config.b_batch}). 'undelivered': committed but not visible within the drain time; "
        "'not issued': scheduled in the window while every worker was busy. "
        f"'busy cores': the machine's, of {os.cpu_count()}, while the load ran; the JSON splits "
        "them into generator (this process, with SQLite), relay, broker and database, and gives "
        "the time from DB commit to the relay's produce() (the record's timestamp). "
        f"Consumer: read_committed, {', '.join(config.e2e_consumer) or 'librdkafka defaults'}."
    )
    result.seconds = time.monotonic() - started
    return result


def _progress(row: Row) -> None:
    c, m = row.config, row.metrics
    print(
        f"  end_to_end {c['impl']:<10} {c['db']:<10} offered {c['offered_per_s']:>6,}/s  "
        f"achieved {m['achieved_per_s'].median:>7,.0f}/s  p50 {m['p50_ms'].median:7.1f} ms  "
        f"p99 {m['p99_ms'].median:7.1f} ms  max {m['max_ms'].median:7.1f} ms  "
        f"undelivered {m['undelivered'].median:.0f}",
        flush=True,
    )

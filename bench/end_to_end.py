"""Scenario 3, end to end: commit-to-visible latency at a fixed offered load, ours vs B vs C.

An open-loop scheduler in each of several generator processes (bench/generator.py) issues its
share of the offered rate (whether or not earlier transactions have finished) to its pool of
worker threads; each transaction is the producer path's business write and one 1 KiB message
carrying a ``bench-seq`` header. When its DB commit returns, the transaction's commit time is
stamped (a SQLAlchemy ``after_commit`` hook, on the monotonic clock). One relay process (ours:
``python -m relay``; B: the polling relay at its default interval; C, PostgreSQL only:
Debezium's connector on a Kafka Connect worker) promotes, and a ``read_committed`` consumer in
its own process stamps each record's arrival on the same
machine-wide clock. Latency = arrival - commit.

The rate the system really committed is reported beside the offered one: when it cannot keep
up, the scheduler waits for a free worker and the achieved rate shows it. How busy the machine
was while the load ran, and which process used the cores (``bench/cpu.py``), is recorded with
each run: a latency measured on a saturated machine is a queue's.
"""

from __future__ import annotations

import functools
import os
import time

from bench.config import BenchConfig
from bench.cpu import CpuMeter
from bench.e2e_pipeline import Pipeline
from bench.model import Row, ScenarioResult, repeat
from bench.procs import Context
from bench.services import Services
from bench.stats import percentiles

IMPLS = ("ours", "baseline_b", "baseline_c")
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


def measure(pipeline: Pipeline, rate: float, seconds: float, workers: int) -> dict[str, float]:
    """One timed run: load, wait for the records to become visible, then the latencies."""
    before = pipeline.watcher.count
    meter = CpuMeter(pipeline.cpu_roles())
    meter.start()
    load = pipeline.generator.run(rate, seconds, workers)
    cores = meter.stop()
    committed = load.committed
    pipeline.watcher.wait_for(before + len(committed), timeout=60, stalled_after=20)
    snapshot = pipeline.watcher.snapshot()
    arrived, produced = snapshot.first_arrival(), snapshot.first_timestamp()
    commits = load.commits
    latencies = [
        (arrived[seq] - commits[seq]) / 1e6
        for seq in committed
        if seq in arrived and seq in commits
    ]
    p50, p99 = percentiles(latencies, (50, 99))
    # record timestamps are wall clock, commits monotonic: one offset, read right after the run
    wall_ns = time.time_ns() - time.monotonic_ns()
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
        "achieved_per_s": len(committed) / load.elapsed,
        "undelivered": float(len(committed) - len(latencies)),
        "errors": float(len(load.errors)),
        "shed": float(load.shed),
        "to_relay_p50_ms": r50,
        "to_relay_p99_ms": r99,
        **{f"cores_{role}": used for role, used in cores.items()},
    }


#: Every pipeline runs load this long before its first figure. A JVM measured right after its
#: start is JIT-cold, which a broker or a Connect worker running for days is not: C's worker had
#: a p50 of ~280 ms at 100/s after 20 s at 400/s, against 824-1,154 ms right after its start
#: with the usual 3 s warm-up. The broker is warm for the load of the scenario before (the
#: relay's backlogs), not for this one's small Kafka transactions, and whichever pipeline came
#: first paid for the difference: on a broker started for this scenario alone, its C2 compiler
#: threads used 0.52 of a core through ours' first 25 s at 100/s and faded to ~0.04 after
#: ~90 s, the broker's cores falling from 1.31 to 0.55-0.60 and ours' p99 from 392 to ~50-80
#: ms; B, measured after ours, never met it (docs/benchmarks.md, "End to end: the broker's
#: JIT"). So every pipeline gets the same warm-up, at the same load.
JIT_WARMUP_S = 60.0


def jit_warmup(pipeline: Pipeline, config: BenchConfig) -> None:
    """Load the just-started pipeline for :data:`JIT_WARMUP_S` (at most 500 txn/s)."""
    measure(pipeline, min(500, max(config.loads)), jit_seconds(config), config.e2e_workers)


def jit_seconds(config: BenchConfig) -> float:
    return config.warmup_seconds if config.quick else JIT_WARMUP_S


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
            if impl == "baseline_c" and db != "postgresql":
                continue  # Debezium needs PostgreSQL's logical decoding
            pipeline = Pipeline(services, ctx, db, impl, config)
            try:
                pipeline.start()
                jit_warmup(pipeline, config)
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
        f"{config.e2e_workers} worker threads in {config.e2e_processes} generator processes; "
        f"{config.seconds:.0f} s per run; one relay process "
        f"(ours: defaults; B: polling interval {config.poll_interval_s * 1000:.0f} ms, batches of "
        f"{config.b_batch}; C: Debezium's connector, poll.interval.ms "
        f"{config.poll_interval_s * 1000:.0f}, on PostgreSQL only). Each pipeline ran "
        f"{jit_seconds(config):.0f} s of load before its first figure (its JVMs' JIT). "
        "'undelivered': committed but not visible within the drain time; "
        "'not issued': scheduled in the window while every worker was busy. "
        f"'busy cores': the machine's, of {os.cpu_count()}, while the load ran; the JSON splits "
        "them into generator (its processes, with SQLite), relay, broker and database, and gives "
        "the time from DB commit to the relay's produce() (the record's timestamp; for C the "
        "time Debezium handled the change event). "
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

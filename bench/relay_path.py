"""Scenario 2, the relay path: promotions/s of one relay, and of two.

**Ours**: N committed one-message transactions (1 KiB) are preloaded onto fresh half and op
topics, then ``python -m relay`` child processes (one, or two with different instance ids in
one group) promote them. A ``read_committed`` consumer of the real topic (its own process)
stamps each record when it becomes visible. Promotions/s = records / (last visible - first
visible): the relays' start-up (process, Kafka transactions, group join) is left out, and
reported apart. With two relays the second one's joining (a rebalance: the first instance often
gets all partitions, then gives half back) happens inside the measured span, so the rate from
the moment the last relay logged its assignment to the last record is reported too.

**Baseline C** (PostgreSQL only): N rows preloaded into Debezium's outbox table, drained by
its connector resumed on them (bench/relay_c.py).

**Baseline B**: N rows preloaded into ``outbox_messages``, then one or two polling relay
processes drain them (PostgreSQL: ``FOR UPDATE SKIP LOCKED`` lets two work side by side;
SQLite: they take turns on the write lock). Measured the same way.
"""

from __future__ import annotations

import datetime as dt
import functools
import time
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from bench import preload
from bench.baselines import create_outbox_table, preload_outbox
from bench.config import BenchConfig
from bench.model import Row, ScenarioResult, repeat
from bench.procs import Child, Context, create_topic, holds_partitions, relay_env, unique
from bench.services import Services, engine_for
from bench.watch import Arrivals, Watcher
from outbox.testing.ports import free_port

UNITS = {
    "promotions_per_s": "msg/s",
    "after_join_per_s": "msg/s",
    "startup_s": "s",
    "missing": "count",
    "duplicates": "count",
    "evicted": "count",
    "aborts": "count",
}
COLUMNS = {
    "promotions_per_s": "promotions/s",
    "after_join_per_s": "after join /s",
    "startup_s": "start-up s",
    "missing": "missing",
    "duplicates": "duplicates",
    "evicted": "evicted (ours)",
    "aborts": "Kafka txn aborts (ours)",
}


def rates(
    arrivals: Arrivals, expected: int, started_ns: int, joined_ns: int | None = None
) -> dict[str, float]:
    """Promotions/s from the first to the last visible record; from the moment the last relay
    was assigned its partitions (``joined_ns``) to the last; and the start-up."""
    first = sorted(arrivals.first_arrival().values())
    figures = {
        "missing": float(max(0, expected - len(first))),
        "duplicates": float(arrivals.duplicates),
        "promotions_per_s": float("nan"),
        "after_join_per_s": float("nan"),
    }
    if len(first) < 2:
        return figures
    span = (first[-1] - first[0]) / 1e9
    if span > 0:
        figures["promotions_per_s"] = (len(first) - 1) / span
    if joined_ns is not None:
        after = [t for t in first if t > joined_ns]
        if len(after) > 1 and first[-1] > joined_ns:
            figures["after_join_per_s"] = len(after) / ((first[-1] - joined_ns) / 1e9)
    figures["startup_s"] = (first[0] - started_ns) / 1e9
    return figures


class Relay(Protocol):
    """What :func:`drain` drives: a relay process (:class:`Child`) or a Connect worker."""

    name: str

    def start(self) -> object: ...
    def stop(self) -> int | None: ...
    def log_text(self) -> str: ...
    def tail(self, lines: int = 30) -> str: ...


def last_assignment_ns(children: Sequence[Relay], before_ns: int) -> int | None:
    """When the last of the relays logged its non-empty assignment, on the monotonic clock,
    counting only assignments logged before ``before_ns`` (the drain's end: stopping one relay
    hands its partitions to the other, which logs a new assignment after the records were all
    visible); None when one never did."""
    offset = time.time_ns() - time.monotonic_ns()
    latest = None
    for child in children:
        last = None
        for line in child.log_text().splitlines():
            if holds_partitions(line):
                wall = dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                at = int(wall * 1e9) - offset
                if at <= before_ns:
                    last = at
        if last is None:
            return None
        latest = last if latest is None else max(latest, last)
    return latest


def drain(
    ctx: Context,
    services: Services,
    topic: str,
    expected: int,
    children: Sequence[Relay],
    *,
    group: bool = True,
    metric_ports: list[int] | None = None,
) -> dict[str, float]:
    """Start the watcher, then ``children``; wait until ``expected`` records are visible.

    With ``metric_ports`` (our relays' HTTP ports), the relays' own counters are read before
    they stop: held values evicted for the memory cap, and aborted Kafka transactions.
    """
    watcher = Watcher(ctx, unique("watch-relay"), services.bootstrap, topic).start()
    started = time.monotonic_ns()
    counters: dict[str, float] = {}
    try:
        for child in children:
            child.start()
        done = watcher.wait_for(expected, timeout=120 + expected / 500)
        drained = time.monotonic_ns()
        if metric_ports:
            counters = relay_counters(metric_ports)
    finally:
        for child in children:
            child.stop()
        arrivals = watcher.stop()
    if not done:
        tails = "\n".join(f"--- {c.name}\n{c.tail(10)}" for c in children)
        print(f"  relay: only {watcher.count} of {expected} visible; logs:\n{tails}", flush=True)
    joined = last_assignment_ns(children, drained) if group else None
    return {**rates(arrivals, expected, started, joined), **counters}


#: Relay metric -> our figure, summed over the relays.
RELAY_COUNTERS = {
    "outbox_relay_evicted_records_total": "evicted",
    "outbox_relay_kafka_txn_aborts_total": "aborts",
}


def relay_counters(ports: list[int]) -> dict[str, float]:
    """The relays' own counters from ``/metrics``, summed; NaN when one cannot be read."""
    totals = dict.fromkeys(RELAY_COUNTERS.values(), 0.0)
    for port in ports:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
                text = reply.read().decode()
        except OSError:
            return dict.fromkeys(RELAY_COUNTERS.values(), float("nan"))
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name in RELAY_COUNTERS:
                totals[RELAY_COUNTERS[name]] += float(value)
    return totals


def ours_run(
    services: Services, ctx: Context, count: int, *, relays: int, warmup: bool = False
) -> dict[str, float]:
    prefix, group = unique("__outbox-relay"), unique("bench-relay")
    topic = unique("bench-relayed")
    create_topic(services.bootstrap, topic)
    stream = preload.writer(services.bootstrap, prefix)
    preload.write_transactions(stream, topic, count)
    stream.close()
    ports = [free_port() for _ in range(relays)]
    children = [
        Child(
            ctx,
            f"{'warmup-' if warmup else ''}relay-{group}-{i}",
            "relay",
            env=relay_env(
                services.bootstrap, prefix, group, f"r{i}", http_port=port, http_host="127.0.0.1"
            ),
            profiled=not warmup,
        )
        for i, port in enumerate(ports)
    ]
    return drain(ctx, services, topic, count, children, metric_ports=ports)


def baseline_run(
    services: Services,
    ctx: Context,
    config: BenchConfig,
    url: str,
    count: int,
    *,
    relays: int,
    warmup: bool = False,
) -> dict[str, float]:
    topic = unique("bench-relayed-b")
    create_topic(services.bootstrap, topic)
    engine = engine_for(url)
    preload_outbox(engine, topic, count)
    engine.dispose()
    args = [
        "relay", "--db-url", url, "--bootstrap", services.bootstrap,
        "--batch", str(config.b_batch), "--poll-interval", str(config.poll_interval_s),
    ]  # fmt: skip
    children = [
        Child(
            ctx,
            unique(f"{'warmup-' if warmup else ''}polling-relay-{i}"),
            "bench.baselines",
            args,
            profiled=not warmup,
        )
        for i in range(relays)
    ]
    return drain(ctx, services, topic, count, children, group=False)


def _row(
    config: BenchConfig, key: dict[str, Any], run_once: Callable[..., dict[str, float]]
) -> Row:
    count = config.relay_records
    warm = max(2_000, count // 10)
    metrics = repeat(
        lambda: run_once(count),
        runs=config.runs,
        units=UNITS,
        warmup=lambda: run_once(warm, warmup=True),
    )
    row = Row(key, metrics, {"records": count, "warmup_records": warm})
    m = row.metrics
    print(
        f"  relay {key['impl']:<10} {key['db']:<10} relays={key['relays']} "
        f"{m['promotions_per_s'].median:>9,.0f} promotions/s  after join "
        f"{m['after_join_per_s'].median:>9,.0f}/s  start-up {m['startup_s'].median:.1f} s  "
        f"missing {m['missing'].median:.0f}",
        flush=True,
    )
    return row


def run(services: Services, config: BenchConfig, ctx: Context) -> ScenarioResult:
    started = time.monotonic()
    result = ScenarioResult(
        "relay",
        "Relay path: promotions/s (committed messages made visible to read_committed readers)",
        keys=["impl", "db", "relays"],
        columns=COLUMNS,
    )
    for relays in (1, 2) if "ours" in config.impls else ():
        result.rows.append(
            _row(
                config,
                {"impl": "ours", "db": "-", "relays": relays},
                functools.partial(ours_run, services, ctx, relays=relays),
            )
        )
    for db in config.databases if "baseline_b" in config.impls else ():
        url = services.database(db, "relay_b")
        setup = engine_for(url)
        create_outbox_table(setup)
        setup.dispose()
        for relays in (1, 2):
            result.rows.append(
                _row(
                    config,
                    {"impl": "baseline_b", "db": db, "relays": relays},
                    functools.partial(baseline_run, services, ctx, config, url, relays=relays),
                )
            )
    if "baseline_c" in config.impls and "postgresql" in config.databases:
        from bench import relay_c

        runs = relay_c.ConnectorRuns(services, ctx, config)
        try:
            key = {"impl": "baseline_c", "db": "postgresql", "relays": 1}
            result.rows.append(_row(config, key, runs))
        finally:
            runs.close()
        result.notes.append(relay_c.note(config))
    result.notes.append(
        f"{config.relay_records:,} one-message transactions of 1 KiB per run; the clock runs "
        "from the first to the last record visible to a read_committed consumer. Baseline B: "
        f"batches of {config.b_batch} rows, polling interval {config.poll_interval_s * 1000:.0f} "
        "ms (only slept when a batch comes back empty)."
    )
    result.seconds = time.monotonic() - started
    return result

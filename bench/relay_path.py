"""Scenario 2, the relay path: promotions/s of one relay, and of two.

**Ours**: N committed one-message transactions (1 KiB) are preloaded onto fresh half and op
topics, then ``python -m relay`` child processes (one, or two with different instance ids in
one group) promote them. A ``read_committed`` consumer of the real topic (its own process)
stamps each record when it becomes visible. Promotions/s = records / (last visible - first
visible): the relays' start-up (process, Kafka transactions, group join) is left out, and
reported apart. With two relays the second one's joining (a rebalance: the first instance often
gets all partitions, then gives half back) happens inside the measured span, so the rate from
the moment the last relay logged its assignment to the last record is reported too.

**The protocol floor** (``protocol_floor``): one process doing only the Kafka work every relay
of this protocol does, on the same preload as ours (bench/relay_floor.py); and the same work
through Kafka's Java client (``protocol_floor_jvm``), when a JDK is there to run it.

**Baseline C** (PostgreSQL only): N rows preloaded into Debezium's outbox table, drained by
its connector resumed on them (bench/relay_c.py).

**Baseline B**: N rows preloaded into ``outbox_messages``, then one or two polling relay
processes drain them (PostgreSQL: ``FOR UPDATE SKIP LOCKED`` lets two work side by side;
SQLite: they take turns on the write lock). Measured the same way.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from bench import preload
from bench.baselines import create_outbox_table, preload_outbox
from bench.config import BenchConfig
from bench.drain import drain
from bench.model import Row, ScenarioResult, repeat
from bench.procs import Child, Context, create_topic, relay_env, unique
from bench.relay_floor import jdk_found, jvm_command
from bench.services import Services, engine_for
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


def preloaded(services: Services, count: int, name: str) -> tuple[str, str, str]:
    """``count`` committed transactions on fresh outbox topics: their prefix, a fresh group and
    the fresh real topic they name."""
    prefix, group = unique(f"__outbox-{name}"), unique(f"bench-{name}")
    topic = unique(f"bench-{name}-real")
    create_topic(services.bootstrap, topic)
    stream = preload.writer(services.bootstrap, prefix)
    preload.write_transactions(stream, topic, count)
    stream.close()
    return prefix, group, topic


def ours_run(
    services: Services, ctx: Context, count: int, *, relays: int, warmup: bool = False
) -> dict[str, float]:
    prefix, group, topic = preloaded(services, count, "relay")
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


def floor_run(
    services: Services, ctx: Context, count: int, *, warmup: bool = False
) -> dict[str, float]:
    """The relay's protocol floor (:mod:`bench.relay_floor`) on the same preload as ours."""
    prefix, group, topic = preloaded(services, count, "relay-floor")
    child = Child(
        ctx,
        f"{'warmup-' if warmup else ''}relay-floor-{group}",
        "bench.relay_floor",
        ["--real-topic", topic],
        env=relay_env(services.bootstrap, prefix, group, "floor"),
        profiled=not warmup,
    )
    return drain(ctx, services, topic, count, [child], group=False)


def jvm_floor_run(
    services: Services, ctx: Context, count: int, *, warmup: bool = False
) -> dict[str, float]:
    """The same floor through Kafka's Java client (:func:`bench.relay_floor.jvm_command`)."""
    prefix, group, topic = preloaded(services, count, "relay-floor-jvm")
    classpath = services.harness.kafka_classpath()
    command = jvm_command(classpath, services.bootstrap, prefix, group, topic)
    name = f"{'warmup-' if warmup else ''}relay-floor-jvm-{group}"
    child = Child(ctx, name, "RelayFloor.java", command=command)
    return drain(ctx, services, topic, count, [child], group=False)


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
    if "protocol_floor" in config.impls:
        result.rows.append(
            _row(
                config,
                {"impl": "protocol_floor", "db": "-", "relays": 1},
                functools.partial(floor_run, services, ctx),
            )
        )
        if not jdk_found():
            result.notes.append("No JDK (java and javac): the JVM relay floor was not run.")
        else:
            result.rows.append(
                _row(
                    config,
                    {"impl": "protocol_floor_jvm", "db": "-", "relays": 1},
                    functools.partial(jvm_floor_run, services, ctx),
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
        "ms (only slept when a batch comes back empty). protocol_floor is one process doing "
        "only the Kafka work every relay of this protocol does (bench/relay_floor.py): it reads "
        "the half and op records, writes each half record to the real topic and commits each "
        "consume() in a Kafka transaction with its offsets, decoding and matching nothing; "
        "protocol_floor_jvm does the same through Kafka's Java client "
        "(jvm/relay-floor/RelayFloor.java): no Python object per record."
    )
    result.seconds = time.monotonic() - started
    return result

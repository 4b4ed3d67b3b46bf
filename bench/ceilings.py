"""Scenario 6, the ceilings: what this machine allows for the same work, in the same run.

- **pgbench** against the run's PostgreSQL, with a custom script (``-f``) doing the business
  write of every producer-path figure (one small UPDATE + one 1 KiB INSERT, one transaction),
  ``-M prepared``, at the producer path's client counts: the database's own limit.
- **Python, DB only**: the same business write from Python threads through SQLAlchemy (the
  producer path's stack without Kafka), on PostgreSQL and SQLite (which has no pgbench).
- **Kafka's own perf tools**, the broker jars' ``ProducerPerformance`` (``acks=all``,
  idempotent, 1 KiB records) and ``ConsumerPerformance`` (``read_committed``): the broker's
  limit for 1 KiB records with one client.
"""

from __future__ import annotations

import functools
import glob
import re
import shutil
import subprocess
import time
from importlib import resources
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from bench.config import BenchConfig
from bench.load import closed_loop
from bench.model import Row, ScenarioResult, Units, repeat
from bench.procs import Context, create_topic, unique
from bench.services import Services, engine_for
from bench.workload import business_write, clear, create_schema, pgbench_script

COLUMNS = {
    "per_s": "per s",
    "mb_per_s": "MB/s",
    "avg_ms": "avg ms",
    "p50_ms": "p50 ms",
    "p99_ms": "p99 ms",
}
_TPS = re.compile(r"tps = ([\d.]+) \(without initial connection time\)")
_LATENCY = re.compile(r"latency average = ([\d.]+) ms")
_PRODUCER = re.compile(
    r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency, "
    r"([\d.]+) ms max latency, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th"
)


def find_pgbench() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pgbench"), key=_version)
    return found[-1] if found else shutil.which("pgbench")


def _version(path: str) -> int:
    name = Path(path).parent.parent.name
    return int(name) if name.isdigit() else 0


def pgbench_once(
    binary: str, url: str, script: Path, clients: int, seconds: float
) -> dict[str, float]:
    """One pgbench run: its tps (without connection time) and average latency."""
    u = sa.make_url(url)
    command = [
        binary, "-n", "-M", "prepared", "-f", str(script), "-c", str(clients),
        "-j", str(min(2, clients)), "-T", str(max(1, round(seconds))),
        "-h", str(u.host), "-p", str(u.port), "-U", str(u.username), str(u.database),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    tps, latency = _TPS.search(done.stdout), _LATENCY.search(done.stdout)
    if done.returncode != 0 or tps is None:
        raise RuntimeError(f"pgbench failed ({done.returncode}): {done.stderr or done.stdout}")
    return {
        "per_s": float(tps.group(1)),
        "avg_ms": float(latency.group(1)) if latency else float("nan"),
    }


def pgbench_rows(services: Services, config: BenchConfig, ctx: Context) -> list[Row]:
    binary = find_pgbench()
    if binary is None or "postgresql" not in config.databases:
        return []
    url = services.database("postgresql", "pgbench")
    engine = engine_for(url)
    create_schema(engine)
    script = ctx.folder / "pgbench-business-write.sql"
    script.write_text(pgbench_script())
    rows = []
    units: Units = {"per_s": "txn/s", "avg_ms": "ms"}
    for clients in config.workers:
        clear(engine, ["bench_orders"])
        metrics = repeat(
            functools.partial(pgbench_once, binary, url, script, clients, config.seconds),
            runs=config.runs,
            units=units,
            warmup=functools.partial(
                pgbench_once, binary, url, script, clients, config.warmup_seconds
            ),
        )
        rows.append(Row({"tool": "pgbench", "db": "postgresql", "clients": clients}, metrics))
    engine.dispose()
    return rows


def python_db_rows(services: Services, config: BenchConfig) -> list[Row]:
    rows = []
    units: Units = {"per_s": "txn/s", "avg_ms": "ms", "p50_ms": "ms", "p99_ms": "ms"}
    for db in config.databases:
        url = services.database(db, "dbonly")
        for workers in config.workers:
            engine = engine_for(url, pool_size=workers)
            create_schema(engine)
            clear(engine, ["bench_orders"])
            factory = sessionmaker(engine)

            def txn(customer: int, factory: sessionmaker[Session] = factory) -> None:
                with factory() as session, session.begin():
                    business_write(session, customer)

            def once(w: int = workers, seconds: float = config.seconds) -> dict[str, float]:
                load = closed_loop(txn, workers=w, seconds=seconds)
                figures = load.figures()
                mean = sum(load.latencies_ms) / max(1, len(load.latencies_ms))
                return {
                    "per_s": figures["txn_per_s"],
                    "avg_ms": mean,
                    "p50_ms": figures["p50_ms"],
                    "p99_ms": figures["p99_ms"],
                }

            metrics = repeat(
                once,
                runs=config.runs,
                units=units,
                warmup=lambda: once(seconds=config.warmup_seconds),
            )
            engine.dispose()
            rows.append(Row({"tool": "python-db-only", "db": db, "clients": workers}, metrics))
    return rows


def _java(services: Services, ctx: Context, main: str, *args: str) -> str:
    log4j = resources.files("outbox.testing") / "resources" / "log4j2.properties"
    command = [
        shutil.which("java") or "java", "-Xmx512m", f"-Dlog4j2.configurationFile={log4j}",
        f"-Dkafka.logs.file={ctx.logs / 'kafka-perf-tools.log'}",
        "-cp", services.harness.kafka_classpath(), main, *args,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{main} failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout


def producer_perf(services: Services, ctx: Context, topic: str, records: int) -> dict[str, float]:
    out = _java(
        services, ctx, "org.apache.kafka.tools.ProducerPerformance",
        "--bootstrap-server", services.bootstrap, "--topic", topic,
        "--num-records", str(records), "--record-size", "1024", "--throughput", "-1",
        "--command-property", "acks=all", "--command-property", "enable.idempotence=true",
    )  # fmt: skip
    found = _PRODUCER.findall(out)
    if not found:
        raise RuntimeError(f"no summary line in ProducerPerformance's output:\n{out[-1000:]}")
    last = found[-1]
    return {
        "per_s": float(last[1]),
        "mb_per_s": float(last[2]),
        "avg_ms": float(last[3]),
        "p50_ms": float(last[5]),
        "p99_ms": float(last[7]),
    }


def consumer_perf(services: Services, ctx: Context, topic: str, records: int) -> dict[str, float]:
    out = _java(
        services, ctx, "org.apache.kafka.tools.ConsumerPerformance",
        "--bootstrap-server", services.bootstrap, "--topic", topic,
        "--num-records", str(records), "--timeout", "30000", "--group", unique("bench-perf"),
        "--command-property", "isolation.level=read_committed",
    )  # fmt: skip
    lines = [line for line in out.splitlines() if line.strip()]
    header = next(i for i, line in enumerate(lines) if line.startswith("start.time"))
    names = [n.strip() for n in lines[header].split(",")]
    values = dict(zip(names, [v.strip() for v in lines[header + 1].split(",")], strict=False))
    return {
        "per_s": float(values["fetch.nMsg.sec"]),
        "mb_per_s": float(values["fetch.MB.sec"]),
        "with_rebalance_per_s": float(values["nMsg.sec"]),
    }


def kafka_rows(services: Services, config: BenchConfig, ctx: Context) -> list[Row]:
    topic = unique("bench-perf")
    create_topic(services.bootstrap, topic)
    records = config.kafka_records
    warm = max(10_000, records // 10)
    produce = repeat(
        lambda: producer_perf(services, ctx, topic, records),
        runs=config.runs,
        units={
            "per_s": "records/s",
            "mb_per_s": "MB/s",
            "avg_ms": "ms",
            "p50_ms": "ms",
            "p99_ms": "ms",
        },
        warmup=lambda: producer_perf(services, ctx, topic, warm),
    )
    consume = repeat(
        lambda: consumer_perf(services, ctx, topic, records),
        runs=config.runs,
        units={"per_s": "records/s", "mb_per_s": "MB/s", "with_rebalance_per_s": "records/s"},
        warmup=lambda: consumer_perf(services, ctx, topic, warm),
    )
    info: dict[str, Any] = {"records": records, "record_bytes": 1024, "partitions": 6}
    return [
        Row({"tool": "kafka-producer-perf-test", "db": "-", "clients": 1}, produce, info),
        Row({"tool": "kafka-consumer-perf-test", "db": "-", "clients": 1}, consume, info),
    ]


def run(services: Services, config: BenchConfig, ctx: Context) -> ScenarioResult:
    started = time.monotonic()
    result = ScenarioResult(
        "ceilings",
        "Ceilings: the database's and the broker's own limits on this machine",
        keys=["tool", "db", "clients"],
        columns=COLUMNS,
    )
    for rows in (
        pgbench_rows(services, config, ctx),
        python_db_rows(services, config),
        kafka_rows(services, config, ctx),
    ):
        for row in rows:
            result.rows.append(row)
            c, m = row.config, row.metrics
            extra = f"  {m['mb_per_s'].median:,.0f} MB/s" if "mb_per_s" in m else ""
            print(
                f"  ceiling {c['tool']:<26} {c['db']:<10} clients={c['clients']:<3} "
                f"{m['per_s'].median:>10,.0f}/s{extra}",
                flush=True,
            )
    if find_pgbench() is None:
        result.notes.append("pgbench was not found: no database ceiling from it in this run.")
    result.notes.append(
        "pgbench: -M prepared, -j min(2, clients); the script is the producer path's business "
        "write as one transaction. Kafka tools: 1 KiB records, acks=all, one client, 6 partitions; "
        "the consumer's rate excludes its group join (the JSON's with_rebalance_per_s includes it)."
    )
    result.seconds = time.monotonic() - started
    return result

"""Scenario 4, the checker: resolutions/s for transactions left without an op.

N one-message transactions (1 KiB) have their half record on Kafka and their evidence row
committed in the database, but no op, as if every producer had crashed right after its DB
commit. One producer instance serves the check endpoint (``producer.serve_checks(engine=...,
secret=...)``, its own process) and one ``python -m checker`` resolves them. Resolutions/s =
COMMIT ops the checker wrote, from the first to the last visible on the op topic (read by a
consumer in its own process). The checker's start-up and its ``transaction_timeout_s`` (6 s, a
transaction younger than that is not checked) are left out and reported as the start-up.
"""

from __future__ import annotations

import datetime as dt
import functools
import time

from bench import preload
from bench.config import BenchConfig
from bench.model import Row, ScenarioResult, repeat
from bench.procs import Child, Context, unique
from bench.services import Services, engine_for
from bench.watch import Watcher
from outbox import migrations
from outbox.evidence import EVIDENCE, evidence_table

GROUP = "bench"
SECRET = "bench-check-secret"
UNITS = {
    "resolutions_per_s": "txn/s",
    "startup_s": "s",
    "unresolved": "count",
    "not_commit": "count",
}
COLUMNS = {
    "resolutions_per_s": "resolutions/s",
    "startup_s": "start-up s",
    "unresolved": "unresolved",
    "not_commit": "not COMMIT",
}


def leave_undecided(services: Services, url: str, prefix: str, count: int) -> None:
    """Halves on Kafka, evidence rows committed, no ops."""
    engine = engine_for(url)
    stream = preload.writer(services.bootstrap, prefix, GROUP)

    def evidence(txn_ids: list[str]) -> None:
        now = dt.datetime.now(dt.UTC)
        rows = [
            {"txn_id": t, "kind": EVIDENCE, "producer_group": GROUP, "created_at": now}
            for t in txn_ids
        ]
        with engine.begin() as conn:
            conn.execute(evidence_table.insert(), rows)

    try:
        preload.write_transactions(stream, "bench-checked", count, commit=False, on_chunk=evidence)
    finally:
        stream.close()
        engine.dispose()


def run_once(
    services: Services, ctx: Context, url: str, count: int, *, warmup: bool = False
) -> dict[str, float]:
    prefix = unique("__outbox-checker")
    leave_undecided(services, url, prefix, count)
    endpoint = Child(
        ctx,
        unique(f"{'warmup-' if warmup else ''}check-endpoint"),
        "bench.check_endpoint",
        ["--bootstrap", services.bootstrap, "--prefix", prefix, "--group", GROUP,
         "--db-url", url, "--secret", SECRET],
        profiled=not warmup,
    )  # fmt: skip
    checker = Child(
        ctx,
        unique(f"{'warmup-' if warmup else ''}checker"),
        "checker",
        env={
            "OUTBOX_CHECKER_BOOTSTRAP_SERVERS": services.bootstrap,
            "OUTBOX_CHECKER_TOPIC_PREFIX": prefix,
            "OUTBOX_CHECKER_GROUP_ID": unique("bench-checker"),
            "OUTBOX_CHECKER_SECRET": SECRET,
        },
        profiled=not warmup,
    )
    op_topic = f"{prefix}-op"
    watcher = Watcher(ctx, unique("watch-ops"), services.bootstrap, op_topic, mode="op").start()
    try:
        endpoint.start()
        endpoint.wait_for_log(lambda log: "ready" in log, 60, "check endpoint")
        started = time.monotonic_ns()
        checker.start()
        if not watcher.wait_for(count, timeout=120 + count / 100):
            print(f"  checker: only {watcher.count} of {count}:\n{checker.tail(10)}", flush=True)
    finally:
        checker.stop()
        endpoint.stop()
        arrivals = watcher.stop()
    commits = {
        tag: at
        for tag, kind, at in zip(arrivals.tags, arrivals.kinds, arrivals.arrival_ns, strict=True)
        if kind == "COMMIT"
    }
    times = sorted(commits.values())
    figures = {
        "unresolved": float(count - len(set(arrivals.tags))),
        "not_commit": float(sum(1 for k in arrivals.kinds if k != "COMMIT")),
        "resolutions_per_s": float("nan"),
    }
    if len(times) > 1 and times[-1] > times[0]:
        figures["resolutions_per_s"] = (len(times) - 1) / ((times[-1] - times[0]) / 1e9)
        figures["startup_s"] = (times[0] - started) / 1e9
    return figures


def run(services: Services, config: BenchConfig, ctx: Context) -> ScenarioResult:
    started = time.monotonic()
    result = ScenarioResult(
        "checker",
        "Checker: resolutions/s of transactions left without an op (one live endpoint)",
        keys=["db", "transactions"],
        columns=COLUMNS,
    )
    count = config.checker_txns
    warm = max(1_000, count // 5)
    for db in config.databases:
        url = services.database(db, "checker")
        migrations.upgrade(url)
        metrics = repeat(
            functools.partial(run_once, services, ctx, url, count),
            runs=config.runs,
            units=UNITS,
            warmup=functools.partial(run_once, services, ctx, url, warm, warmup=True),
        )
        row = Row({"db": db, "transactions": count}, metrics, {"warmup_transactions": warm})
        result.rows.append(row)
        m = row.metrics
        print(
            f"  checker {db:<10} {m['resolutions_per_s'].median:>8,.0f} resolutions/s  "
            f"start-up {m['startup_s'].median:.1f} s  unresolved {m['unresolved'].median:.0f}",
            flush=True,
        )
    result.notes.append(
        "Checker and endpoint at their defaults (batches of 200 ids, 4 requests in flight); "
        "start-up includes the checker's transaction_timeout_s of 6 s."
    )
    result.seconds = time.monotonic() - started
    return result

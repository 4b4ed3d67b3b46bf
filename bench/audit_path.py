"""Scenario 5, the audit: seconds to audit N transactions with Spark on ``local[2]``.

The transactions come from the audit's own generator, :func:`bench.audit_million.generate`
(halves, ops, promoted records as producers, checker and relay write them, with a few seeded
anomalies so the report has findings): 1,000,000 transactions in a full run, 20,000 in a quick
one. Each run is the audit as an operator runs it, ``python -m checker.audit --master local[2]``
in a fresh process (Spark's start-up included) with a class-data cache (``--class-cache``,
:mod:`checker.audit.class_cache`), once to warm up (the page cache, and it writes the cache),
then ``runs`` times. The audit's own phase timings come from its ``summary.json``; "Spark
start" is the rest of the wall time (JVM, session, jars).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.config import BenchConfig
from bench.model import Row, ScenarioResult, repeat
from bench.procs import Child, Context, unique
from bench.services import Services

UNITS = {
    "audit_s": "s",
    "read_s": "s",
    "ledger_s": "s",
    "findings_s": "s",
    "spark_start_s": "s",
}
COLUMNS = {
    "audit_s": "audit s (wall)",
    "read_s": "read s",
    "ledger_s": "ledger s",
    "findings_s": "findings s",
    "spark_start_s": "Spark start s",
}
MASTER = "local[2]"


def audit_once(
    services: Services,
    ctx: Context,
    prefix: str,
    seen: list[dict[str, Any]],
    *,
    class_cache: Path,
    warmup: bool = False,
) -> dict[str, float]:
    """One ``python -m checker.audit`` process; its wall time and phases. ``class_cache`` is
    its ``--class-cache``: the warm-up run writes the archive, the timed runs start from it,
    as every audit after the first on one machine does."""
    out = ctx.folder / unique("audit-out")
    child = Child(
        ctx,
        unique("warmup-audit" if warmup else "audit"),
        "checker.audit",
        ["--bootstrap-servers", services.bootstrap, "--topic-prefix", prefix,
         "--as-of", "now+10m", "--master", MASTER, "--out", str(out),
         "--class-cache", str(class_cache)],
        profiled=not warmup,
    )  # fmt: skip
    began = time.monotonic()
    child.start()
    assert child.proc is not None
    code = child.proc.wait()
    wall = time.monotonic() - began
    summary_path = out / "summary.json"
    if code not in (0, 1) or not summary_path.exists():
        raise RuntimeError(f"the audit exited {code}:\n{child.tail(40)}")
    summary = json.loads(summary_path.read_text())
    shutil.rmtree(out, ignore_errors=True)
    timings: dict[str, float] = summary.get("timings_s", {})
    seen.append(
        {
            "exit": code,
            "verdict": summary.get("verdict"),
            "transactions": summary["statistics"].get("transactions"),
            "findings": {n: f["count"] for n, f in summary["findings"].items() if f["count"]},
        }
    )
    return {
        "audit_s": wall,
        "read_s": timings.get("read", float("nan")),
        "ledger_s": timings.get("ledger", float("nan")),
        "findings_s": timings.get("findings and statistics", float("nan")),
        "spark_start_s": wall - timings.get("total", float("nan")),
    }


def run(services: Services, config: BenchConfig, ctx: Context) -> ScenarioResult:
    started = time.monotonic()
    result = ScenarioResult(
        "audit",
        f"Audit: seconds to audit the topics with Spark on {MASTER}",
        keys=["transactions", "master"],
        columns=COLUMNS,
    )
    # Imported here: the generator belongs to the audit's own benchmark script, and a problem
    # there must cost this scenario only, not the whole run.
    from bench import audit_million

    prefix, topic = unique("__outbox-audit"), unique("bench-audited")
    began = time.monotonic()
    written = audit_million.generate(services.bootstrap, prefix, topic, config.audit_txns)
    generation_s = time.monotonic() - began
    seen: list[dict[str, Any]] = []
    cache = Path(tempfile.mkdtemp(prefix="audit-class-cache-"))  # ~200 MB: not kept
    try:
        metrics = repeat(
            lambda: audit_once(services, ctx, prefix, seen, class_cache=cache),
            runs=config.runs,
            units=UNITS,
            warmup=lambda: audit_once(services, ctx, prefix, [], class_cache=cache, warmup=True),
        )
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    seeded = {k: v for k, v in written.items() if k in ("lost", "duplicate") and v}
    info = {
        "written": written,
        "generation_s": round(generation_s, 1),
        "runs": seen,
        "findings_match_seeded": all(s["findings"] == seeded for s in seen),
    }
    row = Row({"transactions": config.audit_txns, "master": MASTER}, metrics, info)
    result.rows.append(row)
    print(
        f"  audit {config.audit_txns:,} transactions: {metrics['audit_s'].median:.1f} s wall "
        f"(Spark start {metrics['spark_start_s'].median:.1f} s); findings as seeded: "
        f"{info['findings_match_seeded']}",
        flush=True,
    )
    result.notes.append(
        "Transactions from bench/audit_million.py's generator (1-3 small JSON messages each, "
        "10% rolled back, 5% decided by the checker, 10 lost and 10 duplicated messages "
        f"seeded); {written['messages']:,} messages. Each run is a fresh `python -m "
        "checker.audit --class-cache DIR` process, its JVM's classes archived by the warm-up "
        "run; 'audit s' is its whole wall time."
    )
    result.seconds = time.monotonic() - started
    return result

"""Scenario 5, the audit: seconds to audit N transactions with Spark on ``local[2]``.

The transactions come from the audit's own generator, :func:`bench.audit_million.generate`
(halves, ops, promoted records as producers, checker and relay write them, with a few seeded
anomalies so the report has findings): 1,000,000 transactions in a full run, 20,000 in a quick
one. Each run is the audit as an operator runs it, ``python -m checker.audit --master local[2]``
in a fresh process (Spark's start-up included) with a class-data cache (``--class-cache``,
:mod:`checker.audit.class_cache`), once to warm up (the page cache, and it writes the cache),
then ``runs`` times. The audit's own phase timings come from its ``summary.json``; "Spark
start" is the rest of the wall time (JVM, session, jars).

It runs on the environment's Java (``JAVA_HOME``, else ``PATH``: the Debian 17 the project
installs) and, where the machine also has a newer JDK 25+ under ``/usr/lib/jvm``, on that one
too, the two interleaved round by round: from Java 25 on the class cache is an ahead-of-time
cache with the methods' profiles, which an operator gets by pointing ``JAVA_HOME`` at such a
JDK. One row per Java, named by its major version; each Java adds a warm-up and ``runs`` runs.
"""

from __future__ import annotations

import functools
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.config import BenchConfig
from bench.model import Row, ScenarioResult, repeat_interleaved
from bench.procs import Child, Context, unique
from bench.services import Services
from checker.audit.class_cache import AOT_JAVA, java_command, java_version, newest_jdk

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
    java_home: Path | None = None,
    warmup: bool = False,
) -> dict[str, float]:
    """One ``python -m checker.audit`` process; its wall time and phases. ``class_cache`` is
    its ``--class-cache``: the warm-up run writes the archive, the timed runs start from it,
    as every audit after the first on one machine does. ``java_home``: its ``JAVA_HOME``
    (None: the environment's)."""
    out = ctx.folder / unique("audit-out")
    child = Child(
        ctx,
        unique("warmup-audit" if warmup else "audit"),
        "checker.audit",
        ["--bootstrap-servers", services.bootstrap, "--topic-prefix", prefix,
         "--as-of", "now+10m", "--master", MASTER, "--out", str(out),
         "--class-cache", str(class_cache)],
        env={"JAVA_HOME": str(java_home)} if java_home is not None else None,
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
        keys=["transactions", "master", "java"],
        columns=COLUMNS,
    )
    # Imported here: the generator belongs to the audit's own benchmark script, and a problem
    # there must cost this scenario only, not the whole run.
    from bench import audit_million

    prefix, topic = unique("__outbox-audit"), unique("bench-audited")
    began = time.monotonic()
    written = audit_million.generate(services.bootstrap, prefix, topic, config.audit_txns)
    generation_s = time.monotonic() - began
    homes = javas()
    seen: dict[int, list[dict[str, Any]]] = {major: [] for major in homes}
    cache = Path(tempfile.mkdtemp(prefix="audit-class-cache-"))  # ~200 MB each: not kept

    def on(major: int, warmup: bool) -> dict[str, float]:
        runs = [] if warmup else seen[major]
        return audit_once(
            services, ctx, prefix, runs, class_cache=cache, java_home=homes[major], warmup=warmup
        )

    try:
        measured = repeat_interleaved(
            {str(major): functools.partial(on, major, False) for major in homes},
            runs=config.runs,
            units=UNITS,
            warmups={str(major): functools.partial(on, major, True) for major in homes},
        )
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    seeded = {k: v for k, v in written.items() if k in ("lost", "duplicate") and v}
    for major, home in homes.items():
        metrics = measured[str(major)]
        info = {
            "written": written,
            "generation_s": round(generation_s, 1),
            "java_home": str(home) if home is not None else "(the environment's)",
            "runs": seen[major],
            "findings_match_seeded": all(s["findings"] == seeded for s in seen[major]),
        }
        config_of = {"transactions": config.audit_txns, "master": MASTER, "java": major}
        result.rows.append(Row(config_of, metrics, info))
        print(
            f"  audit {config.audit_txns:,} transactions, Java {major}: "
            f"{metrics['audit_s'].median:.1f} s wall (Spark start "
            f"{metrics['spark_start_s'].median:.1f} s); findings as seeded: "
            f"{info['findings_match_seeded']}",
            flush=True,
        )
    result.notes.append(
        "Transactions from bench/audit_million.py's generator (1-3 small JSON messages each, "
        "10% rolled back, 5% decided by the checker, 10 lost and 10 duplicated messages "
        f"seeded); {written['messages']:,} messages. Each run is a fresh `python -m "
        "checker.audit --class-cache DIR` process, its JVM's classes archived by the warm-up "
        "run (from Java 25 on, an ahead-of-time cache with the methods' profiles); 'audit s' is "
        "its whole wall time. One row per Java: the project's, and a JDK 25+ the machine has "
        "under /usr/lib/jvm, their runs interleaved."
    )
    result.seconds = time.monotonic() - started
    return result


def javas() -> dict[int, Path | None]:
    """The JVMs to audit on, by major version: the environment's (None: ``JAVA_HOME`` or
    ``PATH`` as the audit finds it), and the newest JDK of a later major under ``/usr/lib/jvm``
    when it is at least :data:`AOT_JAVA`."""
    java = java_command()
    found = java_version(java) if java else None
    if found is None:
        raise RuntimeError(f"no java runs here ({java or 'none on PATH'}): the audit needs one")
    homes: dict[int, Path | None] = {found[0]: None}
    newer = newest_jdk(above=max(found[0], AOT_JAVA - 1))
    if newer is not None:
        homes[newer[0]] = newer[1]
    return homes

"""One audit run: read, judge, count, write the outputs, give the verdict.

:func:`run_audit` works on any SparkSession (``local[*]``, a cluster, a test's); the CLI
(:mod:`checker.audit.cli`) starts one and maps the verdict to an exit code.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from checker.audit import ledger as ledger_mod
from checker.audit.bounds import Earliest, describe
from checker.audit.cache_scope import Cache, CacheScope
from checker.audit.findings import FINDINGS, decisions, delivery, evidence, order
from checker.audit.output import WrittenFindings, finish_summary, write_finding, write_report
from checker.audit.retained import Retained, retained
from checker.audit.settings import AuditSettings, Resolved
from checker.audit.source import AuditInputs, load_inputs, typed
from checker.audit.stats import statistics as statistics_of

#: Spark jobs submitted at once (materialising sources, writing findings).
PARALLEL_JOBS = 4


@dataclass
class AuditResult:
    """The verdict, the summary written to ``summary.json`` and the findings, read from the
    Parquet files the run wrote (:class:`checker.audit.output.WrittenFindings`)."""

    summary: dict[str, Any]
    findings: Mapping[str, DataFrame] = field(default_factory=dict)
    out_dir: Path = Path(".")

    @property
    def clean(self) -> bool:
        return bool(self.summary["verdict"] == "clean")

    @property
    def counts(self) -> dict[str, int]:
        return {name: int(f["count"]) for name, f in self.summary["findings"].items()}

    @property
    def report_path(self) -> Path:
        return self.out_dir / "report.html"

    @property
    def summary_path(self) -> Path:
        return self.out_dir / "summary.json"

    def txn_ids(self, name: str) -> set[str]:
        """The distinct transaction ids of one finding (collected: for tests and small runs)."""
        frame = self.findings[name].select("txn_id").distinct()
        return {r["txn_id"] for r in frame.collect()}


def compute_findings(
    inputs: AuditInputs,
    settings: AuditSettings,
    resolved: Resolved,
    held: Retained | None = None,
    *,
    cache: Cache,
) -> tuple[dict[str, DataFrame], DataFrame, dict[str, DataFrame]]:
    """Every finding as a DataFrame (cached with ``cache``), the (cached) ledger they were
    judged on, and what was not judged because the topics no longer hold it
    (:mod:`checker.audit.retained`), by the name of the summary's statistic that counts it."""
    held = held or Retained()
    frames = typed(inputs)
    halves, ops, promoted = frames["halves"], frames["ops"], frames["promoted"]
    delivered = cache(ledger_mod.deliveries(promoted))
    messages = ledger_mod.messages(halves)
    txns = ledger_mod.transactions(messages)
    ops = cache(ledger_mod.ranked_ops(ops))
    # the transactions of the ops the relay refused, by where those ops are
    # (few: broadcast, so that the ops are not shuffled for them)
    # (few, usually none: looked for in the small cached dead letters, and only then joined)
    letters = inputs.dead_letters.filter(F.col("refused_op")).select(
        F.col("source_partition").alias("partition"), F.col("source_offset").alias("offset")
    )
    refused = (
        ops.select("partition", "offset", "txn_id").join(
            F.broadcast(letters), ["partition", "offset"]
        )
        if letters.take(1)
        else None
    )
    book = ledger_mod.ledger(
        txns,
        ledger_mod.decisions(ops),
        delivered,
        half_log_starts=held.half_log_starts,
        half_read_from=held.half_read_from,
        refused=refused,
    )
    book = cache(book)
    as_of, grace, window = resolved.as_of_ms, settings.grace_ms, settings.window_ms
    since = {t: ms for t, ms in held.complete_since_ms.items() if t in inputs.real_topics}
    unknown_since = held.complete_since_ms.get(settings.topics.op)
    arrived = book
    if held.compactable_before_ms:
        replaced = delivery.superseded(messages, promoted, book, held.compactable_before_ms)
        arrived = delivery.with_superseded(book, replaced)
    found: dict[str, DataFrame] = {
        "lost": delivery.lost(arrived, as_of_ms=as_of, grace_ms=grace, complete_since_ms=since),
        "partial": delivery.partial(
            arrived, as_of_ms=as_of, grace_ms=grace, complete_since_ms=since
        ),
        "phantom": delivery.phantom(promoted, book, unknown_since_ms=unknown_since),
        "duplicate": delivery.duplicate(delivered, book),
        "out_of_order": order.out_of_order(delivered, book),
        "stuck": decisions.stuck(book, as_of_ms=as_of, window_ms=window),
        "given_up": decisions.given_up(book, inputs.dead_letters),
        "conflicting_decisions": decisions.conflicting_decisions(ops, book),
        "unreadable": inputs.unreadable,
    }
    if inputs.evidence is not None:
        found["evidence_without_commit"] = evidence.evidence_without_commit(
            book, inputs.evidence, as_of_ms=as_of, window_ms=window
        )
        found["commit_without_evidence"] = evidence.commit_without_evidence(
            book,
            inputs.evidence,
            groups=settings.evidence_groups,
            horizon_ms=inputs.evidence_horizon_ms,
        )
    ordered = {name: found[name] for name in FINDINGS if name in found}
    cached = {n: f if f.is_cached else cache(f) for n, f in ordered.items()}
    unjudged = {
        "commits_unverifiable": delivery.unverifiable(
            arrived, as_of_ms=as_of, grace_ms=grace, complete_since_ms=since
        ),
        "records_unverifiable": delivery.unjudged_records(
            promoted, book, unknown_since_ms=unknown_since
        ),
    }
    return cached, book, unjudged


def run_audit(spark: Any, settings: AuditSettings, *, now_ms: int | None = None) -> AuditResult:
    """Audit what the topics hold and write ``summary.json``, ``report.html`` and the Parquet
    findings under ``settings.out_dir``.

    Independent Spark jobs (materialising the sources, each finding, the statistics) are
    submitted from a few threads at once: on small data they wait on scheduling and file
    commits more than on CPU. What the run caches is released when it returns or fails
    (:mod:`checker.audit.cache_scope`): a session may run audit after audit.

    Raises:
        AuditConfigError: bad settings, or the internal topics do not exist.
        AuditSourceError: Kafka or the evidence database could not be read.
    """
    clock = _Phases()
    resolved = settings.resolve(now_ms=now_ms if now_ms is not None else int(time.time() * 1000))
    out_dir = Path(settings.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    parquet_root = settings.parquet_dir or str(out_dir / "findings")
    with (
        closing(CacheScope()) as scope,
        ThreadPoolExecutor(PARALLEL_JOBS, thread_name_prefix="audit") as pool,
    ):
        inputs = load_inputs(spark, settings, resolved, cache=scope.cache)
        sources = {
            "half_records_read": inputs.halves,
            "op_records_read": inputs.ops,
            "real_records_read": inputs.promoted,
            "dead_letters_read": inputs.dead_letters,
        }
        materialised = [pool.submit(f.count) for f in (*sources.values(), inputs.unreadable)]
        if inputs.evidence is not None:
            materialised.append(pool.submit(inputs.evidence.count))
        read = dict(zip(sources, [f.result() for f in materialised], strict=False))
        held = retained(
            spark,
            settings,
            inputs,
            now_ms=int(time.time() * 1000),
            earliest=isinstance(resolved.start, Earliest),
        )
        clock.lap("read")
        found, book, unjudged = compute_findings(
            inputs, settings, resolved, held, cache=scope.cache
        )
        book.count()
        unverifiable = {name: pool.submit(frame.count) for name, frame in unjudged.items()}
        clock.lap("ledger")
        stats = pool.submit(
            statistics_of,
            book,
            as_of_ms=resolved.as_of_ms,
            grace_ms=settings.grace_ms,
            window_ms=settings.window_ms,
        )
        outputs = {
            name: pool.submit(
                write_finding,
                name,
                frame,
                parquet_root=parquet_root,
                report_rows=settings.report_rows,
            )
            for name, frame in found.items()
        }
        written = {name: future.result() for name, future in outputs.items()}
        figures = stats.result()
        judged = {name: future.result() for name, future in unverifiable.items()}
        clock.lap("findings and statistics")
    summary = finish_summary(
        {
            "parameters": _parameters(settings, resolved, inputs, held),
            "statistics": {
                **read,
                **figures.counts,
                **judged,
            },
            "latency_ms": figures.latencies,
            "report": str(out_dir / "report.html"),
            "timings_s": clock.laps,
        },
        written,
    )
    write_report(summary, written, figures.histograms, out_dir)
    return AuditResult(summary=summary, findings=WrittenFindings(spark, written), out_dir=out_dir)


class _Phases:
    """Seconds spent in each phase of the run, for the summary (where did the time go?)."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.monotonic()

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.laps[name] = round(now - self._last, 1)
        self.laps["total"] = round(sum(v for k, v in self.laps.items() if k != "total"), 1)
        self._last = now


def _parameters(
    settings: AuditSettings, resolved: Resolved, inputs: AuditInputs, held: Retained
) -> dict[str, Any]:
    return {
        "bootstrap_servers": settings.bootstrap_servers,
        "topic_prefix": settings.topic_prefix,
        "from": describe(resolved.start),
        "complete_since_ms": dict(sorted(held.complete_since_ms.items())),
        "half_read_from": dict(sorted((held.half_read_from or {}).items())),
        "compacted_real_topics": sorted(held.compactable_before_ms),
        "retention_unknown": held.unknown,
        "to": describe(resolved.end),
        "as_of_ms": resolved.as_of_ms,
        "grace_ms": settings.grace_ms,
        "window_ms": settings.window_ms,
        "lookback_ms": settings.lookback_ms,
        "real_topics": inputs.real_topics,
        "missing_real_topics": inputs.missing_real_topics,
        "partitions": dict(sorted(inputs.partitions.items())),
        "evidence": settings.evidence_table if settings.evidence_url else None,
        "evidence_horizon_ms": inputs.evidence_horizon_ms,
    }

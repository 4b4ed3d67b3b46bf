"""The audit's outputs: Parquet per finding, ``summary.json``, ``report.html``.

Parquet goes under ``out_dir/findings`` unless ``parquet_dir`` names another place (on a
cluster, a path every executor can write). The JSON summary and the HTML report are written by
the driver; the report shows the first rows of each finding, the Parquet files hold them all.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, Row

from checker.audit.findings import FINDINGS
from checker.audit.plots import histogram_png
from checker.audit.report import LATENCY_TITLES, FindingTable, render

#: Transaction ids of each finding listed in the JSON summary (all are in the Parquet files).
SAMPLE_IDS = 20


def _plain(value: Any) -> Any:
    """Spark values as JSON-able / printable Python values."""
    if isinstance(value, Row):
        return {k: _plain(v) for k, v in value.asDict().items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bytearray):
        return bytes(value)
    return value


@dataclass(frozen=True)
class FindingOutput:
    """One finding, written: its row count, the rows for the report, its Parquet path."""

    name: str
    table: FindingTable
    parquet: str

    def listing(self) -> dict[str, Any]:
        return {
            "count": self.table.total,
            "sample_txn_ids": _sample_ids(list(self.table.columns), self.table.rows),
            "parquet": self.parquet,
        }


def write_finding(
    name: str, frame: DataFrame, *, parquet_root: str, report_rows: int
) -> FindingOutput:
    """Count one (cached) finding, take its first rows, write all of it as Parquet."""
    total = frame.count()
    rows = [_plain(list(r)) for r in frame.limit(report_rows).collect()] if total else []
    path = f"{parquet_root.rstrip('/')}/{name}.parquet"
    frame.coalesce(1).write.mode("overwrite").parquet(path)
    return FindingOutput(name, FindingTable(frame.columns, rows, total), path)


class WrittenFindings(Mapping[str, DataFrame]):
    """Each finding as a DataFrame over the Parquet files a run wrote: what its summary counted,
    whatever the topics hold since, with nothing of the run left cached. Read when first asked
    for (the CLI never asks; on a cluster the driver may not see a local ``--parquet-dir``).
    Another run writing to the same place replaces the files under a DataFrame read before:
    give each run its own ``out_dir``."""

    def __init__(self, spark: Any, written: Mapping[str, FindingOutput]) -> None:
        self._spark = spark
        self._paths = {name: w.parquet for name, w in written.items()}
        self._read: dict[str, DataFrame] = {}

    def __getitem__(self, name: str) -> DataFrame:
        if name not in self._read:
            frame: DataFrame = self._spark.read.parquet(self._paths[name])
            self._read[name] = frame
        return self._read[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths)

    def __len__(self) -> int:
        return len(self._paths)


def finish_summary(summary: dict[str, Any], written: Mapping[str, FindingOutput]) -> dict[str, Any]:
    """The summary with the verdict and the findings first."""
    listed = {name: written[name].listing() for name in FINDINGS if name in written}
    violations = sum(f["count"] for f in listed.values())
    return {
        "verdict": "clean" if violations == 0 else "violations",
        "violations": violations,
        "findings": listed,
        **summary,
    }


def write_report(
    summary: dict[str, Any],
    written: Mapping[str, FindingOutput],
    histograms: Mapping[str, list[tuple[int, int]]],
    out_dir: Path,
) -> None:
    """``report.html`` and ``summary.json`` in ``out_dir``."""
    images = {
        name: histogram_png(pairs, LATENCY_TITLES.get(name, name))
        for name, pairs in histograms.items()
    }
    tables = {name: w.table for name, w in written.items()}
    (out_dir / "report.html").write_text(render(summary, tables, images), encoding="utf-8")
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")


def _sample_ids(columns: list[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """The first distinct transaction ids among the rows shown in the report."""
    if "txn_id" not in columns:
        return []
    where = columns.index("txn_id")
    ids = dict.fromkeys(r[where] for r in rows if r[where] is not None)
    return list(ids)[:SAMPLE_IDS]

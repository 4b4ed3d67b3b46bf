"""The HTML report: one self-contained file (inline CSS, plots as base64 PNG, no script).

Pure Python over plain data (the JSON summary, sample rows of each finding, PNG bytes), so it
renders the same from a test, the CLI or a notebook, and opens anywhere without a network.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from checker.audit.bins import label_ms
from checker.audit.findings import FINDINGS

LATENCY_TITLES = {
    "half_to_decision": "half record -> decision",
    "decision_to_promotion": "decision -> promotion (last message)",
    "half_to_promotion": "half record -> promotion (end to end)",
}
#: Columns whose values are durations, not points in time.
DURATION_COLUMNS = {"age_ms", "grace_ms", "window_ms", "lookback_ms"}

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1400px; }
h1 { margin-bottom: 0.2em; }
.verdict { padding: 0.6em 1em; border-radius: 6px; font-weight: bold; font-size: 1.2em; }
.clean { background: #e3f4e1; color: #1d5e1a; }
.violations { background: #fbe3e3; color: #8a1c1c; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em 0; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; }
td.num { text-align: right; }
td.id { white-space: nowrap; font-family: ui-monospace, monospace; }
.note { color: #666; font-size: 0.85em; }
img { display: block; margin: 0.5em 0 1.5em 0; border: 1px solid #ddd; }
"""


@dataclass(frozen=True)
class FindingTable:
    """The first rows of one finding, and how many it has in all."""

    columns: Sequence[str]
    rows: Sequence[Sequence[Any]]
    total: int


def render(
    summary: Mapping[str, Any],
    tables: Mapping[str, FindingTable],
    images: Mapping[str, bytes],
) -> str:
    """The whole page."""
    verdict = str(summary.get("verdict", "unknown"))
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<title>kafka-outbox audit</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>kafka-outbox audit</h1>",
        f'<p class="verdict {_e(verdict)}" id="verdict">{_e(_verdict_text(summary))}</p>',
        _section_parameters(summary),
        _section_findings_overview(summary),
        _section_counts(summary),
        _section_latencies(summary, images),
    ]
    parts += [_section_finding(name, tables.get(name)) for name in FINDINGS]
    parts.append("</body></html>")
    return "\n".join(parts)


def _verdict_text(summary: Mapping[str, Any]) -> str:
    if summary.get("verdict") == "clean":
        return "CLEAN: no violation found"
    return f"VIOLATIONS: {summary.get('violations', '?')} finding rows - see below"


def _section_parameters(summary: Mapping[str, Any]) -> str:
    params = summary.get("parameters", {})
    rows = [(k, json.dumps(v) if isinstance(v, dict) else v) for k, v in params.items()]
    return "<h2>Parameters</h2>" + _kv_table(rows, "parameters")


def _section_findings_overview(summary: Mapping[str, Any]) -> str:
    counts = summary.get("findings", {})
    rows = [
        (f'<a href="#finding-{name}">{_e(name)}</a>', counts.get(name, {}).get("count", 0))
        for name in FINDINGS
    ]
    body = "".join(f'<tr><td>{n}</td><td class="num">{c}</td></tr>' for n, c in rows)
    return (
        '<h2>Findings</h2><table id="findings-overview"><tr><th>finding</th><th>rows</th></tr>'
        f"{body}</table>"
    )


def _section_counts(summary: Mapping[str, Any]) -> str:
    stats = summary.get("statistics", {})
    flat = [(k, v) for k, v in stats.items() if not isinstance(v, dict)]
    nested = [
        (f"{k}: {inner}", v)
        for k, d in stats.items()
        if isinstance(d, dict)
        for inner, v in d.items()
    ]
    return "<h2>Counts</h2>" + _kv_table(flat + nested, "statistics")


def _section_latencies(summary: Mapping[str, Any], images: Mapping[str, bytes]) -> str:
    latencies = summary.get("latency_ms", {})
    head = "<tr><th>latency</th><th>count</th><th>p50</th><th>p90</th><th>p99</th><th>max</th></tr>"
    body = ""
    for name, values in latencies.items():
        cells = [values.get("count", 0)] + [
            _duration(values.get(k)) for k in ("p50", "p90", "p99", "max")
        ]
        body += f"<tr><td>{_e(LATENCY_TITLES.get(name, name))}</td>"
        body += "".join(f'<td class="num">{_e(c)}</td>' for c in cells) + "</tr>"
    pictures = "".join(
        f'<img id="plot-{_e(name)}" alt="{_e(LATENCY_TITLES.get(name, name))} histogram" '
        f'src="data:image/png;base64,{base64.b64encode(png).decode()}">'
        for name, png in images.items()
    )
    return f'<h2>Latencies</h2><table id="latencies">{head}{body}</table>{pictures}'


def _section_finding(name: str, table: FindingTable | None) -> str:
    title = f'<h2 id="finding-{_e(name)}">{_e(name)}</h2><p class="note">{_e(FINDINGS[name])}</p>'
    if table is None or table.total == 0:
        return title + "<p>none</p>"
    head = "".join(f"<th>{_e(c)}</th>" for c in table.columns)
    body = "".join(
        "<tr>" + "".join(_cell(c, v) for c, v in zip(table.columns, row, strict=True)) + "</tr>"
        for row in table.rows
    )
    shown = f"showing {len(table.rows)} of {table.total}; all rows in findings/{name}.parquet"
    return (
        f'{title}<p class="note">{_e(shown)}</p>'
        f'<table class="finding" id="table-{_e(name)}"><tr>{head}</tr>{body}</table>'
    )


def _kv_table(rows: Sequence[tuple[str, Any]], ident: str) -> str:
    body = "".join(
        f"<tr><td>{k if k.startswith('<a') else _e(k)}</td><td>{_e(v)}</td></tr>" for k, v in rows
    )
    return f'<table id="{ident}">{body}</table>'


def _cell(column: str, value: Any) -> str:
    text = format_value(column, value)
    if column.endswith("txn_id"):
        return f'<td class="id">{_e(text)}</td>'
    if column.endswith("_ms"):
        return f'<td class="id">{_e(text)}</td>'
    numeric = isinstance(value, int | float)
    return f'<td class="num">{_e(text)}</td>' if numeric else f"<td>{_e(text)}</td>"


def format_value(column: str, value: Any) -> str:
    """A cell's text: times as ISO-8601 UTC, durations as 1.2s, lists joined, bytes decoded."""
    if value is None:
        return ""
    if column in DURATION_COLUMNS and isinstance(value, int | float):
        return _duration(value)
    if column.endswith("_ms") and isinstance(value, int) and value > 10**11:
        moment = dt.datetime.fromtimestamp(value / 1000, dt.UTC)
        return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "backslashreplace")
    if isinstance(value, list | tuple):
        return ", ".join(format_value(column, v) for v in value)
    if isinstance(value, dict):
        return " ".join(f"{k}={format_value(k, v)}" for k, v in value.items())
    return str(value)


def _duration(value: Any) -> str:
    return "" if value is None else label_ms(float(value))


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)

"""The run's outputs: ``bench/results/<timestamp>.json``, the printed tables, and the README's
benchmark section (between ``<!-- bench:begin -->`` and ``<!-- bench:end -->``)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from bench.model import ScenarioResult
from bench.procs import ROOT
from bench.stats import fmt
from bench.target_model import Target

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def machine_info() -> dict[str, Any]:
    """What the figures ran on: CPU, cores, memory, OS, Python, the checkout's commit."""
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": round(_meminfo_kib("MemTotal") / 1024 / 1024, 1),
        "os": f"{_os_name()}, {platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "load_average": [round(v, 2) for v in os.getloadavg()],
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _meminfo_kib(name: str) -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _os_name() -> str:
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    return platform.platform()


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    except OSError:
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def machine_line(document: dict[str, Any]) -> str:
    """One line naming the machine and the services, for the README and the printed report."""
    m, s = document["machine"], document["services"]
    parts = [
        f"{m['cores']} cores ({m['cpu']}), {m['memory_gib']} GiB RAM, {m['os']}",
        f"Python {m['python']}",
    ]
    kafka = s.get("kafka", {})
    parts.append(
        f"Kafka {kafka.get('version') or '?'} (1 broker, {kafka.get('provider')} provider)"
    )
    pg = s.get("postgresql")
    if pg:
        settings = ", ".join(
            f"{k}={v}" for k, v in pg["settings"].items() if k != "max_connections"
        )
        parts.append(
            f"PostgreSQL {pg['version'].split()[0]} ({pg['provider']} provider, {settings})"
        )
    sqlite = s.get("sqlite", {})
    parts.append(f"SQLite {sqlite.get('version')} ({sqlite.get('settings')})")
    load = m.get("load_average")
    if load:
        parts.append(f"load average at the start {load[0]}")
    commit = (m.get("git_commit") or "?")[:10] + (
        " (uncommitted changes)" if m.get("git_dirty") else ""
    )
    parts.append(f"commit {commit}")
    return "; ".join(parts)


def speed_line(document: dict[str, Any]) -> str | None:
    """The host's Python speed before and after each scenario (bench/calibration.py); None for a
    results file written before the probe existed."""
    speeds = document.get("python_speed")
    if not speeds:
        return None
    each = ", ".join(
        f"{name} {' -> '.join(f'{v:g}' for v in values)}" for name, values in speeds.items()
    )
    return (
        f"Python speed (M steps/s of a fixed loop, before -> after each scenario; "
        f"bench/calibration.py): {each}"
    )


def _cell(row_metrics: dict[str, Any], metric: str) -> str:
    summary = row_metrics.get(metric)
    if summary is None:
        return ""
    median = fmt(summary.median, summary.unit)
    return median if len(summary.runs) < 2 else f"{median} ({summary.spread()})"


def scenario_table(result: ScenarioResult) -> str:
    """A markdown table: one row per configuration, each metric as ``median (min-max)``."""
    head = [*result.keys, *result.columns.values()]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in result.rows:
        keys = [_key(row.config.get(k)) for k in result.keys]
        cells = [_cell(row.metrics, m) for m in result.columns]
        lines.append("| " + " | ".join(keys + cells) + " |")
    return "\n".join(lines)


def _key(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def targets_table(targets: list[Target]) -> str:
    lines = [
        "| target | measured (median) | spread (min-max) | met | note |",
        "| --- | --- | --- | --- | --- |",
    ]
    for t in targets:
        lines.append(f"| {t.goal} | {t.measured} | {t.spread} | {t.verdict()} | {t.note} |")
    return "\n".join(lines)


def render(
    document: dict[str, Any], results: dict[str, ScenarioResult], targets: list[Target]
) -> str:
    """Everything the terminal shows at the end of a run, as markdown."""
    quick = document["settings"]["quick"]
    parts = [
        f"# Benchmark {document['timestamp']}"
        + (" (QUICK MODE: smoke run, not results)" if quick else ""),
        f"Machine: {machine_line(document)}",
        *filter(None, [speed_line(document)]),
        f"Runs per configuration: {document['settings']['runs']} after a warm-up; cells are "
        "median (min-max over the runs).",
        "## Targets (issue 30; issue 29's asyncio one)",
        targets_table(targets),
    ]
    for result in results.values():
        parts.append(f"## {result.title}")
        parts.append(scenario_table(result))
        parts.extend(f"- {note}" for note in result.notes)
    return "\n\n".join(parts) + "\n"


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")


def readme_block(
    document: dict[str, Any], results: dict[str, ScenarioResult], targets: list[Target]
) -> str:
    """The README's benchmark section: the machine, the targets, each scenario's table."""
    runs = document["settings"]["runs"]
    lines = [
        f"Latest run: {document['timestamp']} (`make bench`, {runs} run{'s' if runs != 1 else ''} "
        "per configuration after a warm-up; median (min-max)), on: "
        f"{machine_line(document)}.",
    ]
    speed = speed_line(document)
    if speed is not None:
        lines += ["", f"{speed}."]
    lines += ["", targets_table(targets)]
    for result in results.values():
        lines += [
            "",
            f"<details><summary>{result.title}</summary>",
            "",
            scenario_table(result),
            "",
            *[f"- {note}" for note in result.notes],
            "</details>",
        ]
    return "\n".join(lines)


def update_readme(readme: Path, block: str) -> bool:
    """Replace what lies between the markers; False when the README has no markers."""
    text = readme.read_text()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        return False
    readme.write_text(text[: start + len(BEGIN)] + "\n" + block + "\n" + text[end:])
    return True

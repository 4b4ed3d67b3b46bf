"""One PNG per scenario (matplotlib, no display): medians as bars or lines, min-max as
error bars."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.model import Row, ScenarioResult
from bench.stats import Summary


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _errors(summaries: Sequence[Summary | None]) -> tuple[list[float], list[list[float]]]:
    medians, low, high = [], [], []
    for s in summaries:
        ok = s is not None and not math.isnan(s.median)
        median = s.median if ok and s is not None else 0.0
        medians.append(median)
        low.append(median - s.min if ok and s is not None else 0.0)
        high.append(s.max - median if ok and s is not None else 0.0)
    return medians, [low, high]


def grouped_bars(
    ax: Any,
    groups: list[str],
    series: dict[str, list[Summary | None]],
    *,
    title: str,
    ylabel: str,
    log: bool = False,
) -> None:
    """Bars of each series side by side within each group, min-max error bars."""
    width = 0.8 / max(1, len(series))
    for i, (name, summaries) in enumerate(series.items()):
        medians, errors = _errors(summaries)
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, medians, width, yerr=errors, capsize=2, label=name)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=30, ha="right", fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)


def _metric(rows: list[Row], metric: str) -> list[Summary | None]:
    return [r.metrics.get(metric) for r in rows]


def producer(result: ScenarioResult, plt: Any) -> Any:
    dbs = sorted({r.config["db"] for r in result.rows})
    fig, axes = plt.subplots(2, len(dbs), figsize=(7 * len(dbs), 8), squeeze=False)
    for col, db in enumerate(dbs):
        rows = [r for r in result.rows if r.config["db"] == db]
        impls = list(dict.fromkeys(r.config["impl"] for r in rows))
        shapes = list(dict.fromkeys((r.config["workers"], r.config["messages"]) for r in rows))
        groups = [f"{w} thr, {m} msg" for w, m in shapes]
        for line, (metric, label) in enumerate((("txn_per_s", "txn/s"), ("p50_ms", "p50 ms"))):
            series = {
                impl: [_find(rows, impl, shape, metric) for shape in shapes] for impl in impls
            }
            grouped_bars(
                axes[line][col],
                groups,
                series,
                title=f"{db}: {label}",
                ylabel=label,
                log=metric == "p50_ms",
            )
    return fig


def _find(rows: list[Row], impl: str, shape: tuple[int, int], metric: str) -> Summary | None:
    for r in rows:
        if r.config["impl"] == impl and (r.config["workers"], r.config["messages"]) == shape:
            return r.metrics.get(metric)
    return None


def end_to_end(result: ScenarioResult, plt: Any) -> Any:
    dbs = sorted({r.config["db"] for r in result.rows})
    fig, axes = plt.subplots(1, len(dbs), figsize=(7 * len(dbs), 5), squeeze=False)
    for col, db in enumerate(dbs):
        ax = axes[0][col]
        for impl in dict.fromkeys(r.config["impl"] for r in result.rows):
            rows = [r for r in result.rows if r.config["db"] == db and r.config["impl"] == impl]
            loads = [r.config["offered_per_s"] for r in rows]
            for metric, style in (("p50_ms", "-o"), ("p99_ms", "--s"), ("max_ms", ":^")):
                medians, errors = _errors(_metric(rows, metric))
                ax.errorbar(
                    loads, medians, yerr=errors, fmt=style, capsize=2, label=f"{impl} {metric[:-3]}"
                )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("offered load, transactions/s")
        ax.set_ylabel("commit -> visible, ms")
        ax.set_title(f"end to end, {db}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return fig


def simple(result: ScenarioResult, plt: Any, metrics: dict[str, str], log: bool = False) -> Any:
    """Bars per row for each metric, one panel per metric."""
    fig, axes = plt.subplots(1, len(metrics), figsize=(6 * len(metrics), 5), squeeze=False)
    labels = [" / ".join(str(v) for v in r.config.values()) for r in result.rows]
    for i, (metric, label) in enumerate(metrics.items()):
        grouped_bars(
            axes[0][i],
            labels,
            {label: _metric(result.rows, metric)},
            title=label,
            ylabel=label,
            log=log,
        )
    return fig


def render(result: ScenarioResult, folder: Path) -> Path | None:
    """The scenario's chart as ``<folder>/<scenario>.png``; None when it has no rows."""
    if not result.rows:
        return None
    plt = _pyplot()
    if result.name == "producer":
        fig = producer(result, plt)
    elif result.name == "end_to_end":
        fig = end_to_end(result, plt)
    elif result.name == "relay":
        fig = simple(
            result, plt, {"promotions_per_s": "promotions/s", "after_join_per_s": "after join /s"}
        )
    elif result.name == "checker":
        fig = simple(result, plt, {"resolutions_per_s": "resolutions/s"})
    elif result.name == "audit":
        fig, ax = plt.subplots(figsize=(8, 5))
        labels = [
            f"{r.config['transactions']:,} txns, {r.config['master']}"
            + (f", Java {r.config['java']}" if r.config.get("java") else "")
            for r in result.rows
        ]
        series = {label: _metric(result.rows, m) for m, label in result.columns.items()}
        grouped_bars(ax, labels, series, title="seconds", ylabel="s")
    else:
        fig = simple(result, plt, {"per_s": "per second (txn or records)"}, log=True)
    fig.suptitle(result.title, fontsize=11)
    fig.tight_layout()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{result.name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

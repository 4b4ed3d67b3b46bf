"""What a scenario hands back: rows of (configuration, metrics over runs), and notes."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from bench.stats import Summary

#: One timed run's figures, by metric name.
RunFigures = dict[str, float]
#: Metric name -> unit, for the metrics a row reports.
Units = Mapping[str, str]
#: What names one variant of an interleaved comparison (e.g. ``"ours"``).
Variant = TypeVar("Variant", bound=Hashable)


@dataclass
class Row:
    """One configuration of a scenario (e.g. ours, PostgreSQL, 16 workers, 1 message/txn)."""

    config: dict[str, Any]
    metrics: dict[str, Summary]
    #: Figures that are not repeated measurements (e.g. the offered rate, records preloaded).
    info: dict[str, Any] = field(default_factory=dict)

    def value(self, metric: str) -> float | None:
        summary = self.metrics.get(metric)
        return None if summary is None else summary.median

    def matches(self, **config: Any) -> bool:
        return all(self.config.get(k) == v for k, v in config.items())

    def to_json(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "metrics": {name: s.to_json() for name, s in self.metrics.items()},
            "info": self.info,
        }


@dataclass
class ScenarioResult:
    """All rows of one scenario, with the columns a table shows and free-text notes."""

    name: str
    title: str
    #: Config keys shown as the leading columns of the table, in order.
    keys: list[str]
    #: Metric name -> column heading, in order.
    columns: dict[str, str]
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def find(self, **config: Any) -> Row | None:
        return next((r for r in self.rows if r.matches(**config)), None)

    @classmethod
    def from_json(cls, name: str, data: dict[str, Any]) -> ScenarioResult:
        """A scenario as a results file stored it (to re-render tables, charts, README)."""
        rows = [
            Row(
                r["config"],
                {m: Summary.from_json(s) for m, s in r["metrics"].items()},
                r.get("info", {}),
            )
            for r in data["rows"]
        ]
        return cls(
            name,
            data["title"],
            data["keys"],
            data["columns"],
            rows,
            data.get("notes", []),
            data.get("seconds", 0.0),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "keys": self.keys,
            "columns": self.columns,
            "rows": [r.to_json() for r in self.rows],
            "notes": self.notes,
            "seconds": round(self.seconds, 1),
        }


def repeat(
    run: Callable[[], RunFigures],
    *,
    runs: int,
    units: Units,
    warmup: Callable[[], object] | None = None,
) -> dict[str, Summary]:
    """Warm up once, then time ``runs`` runs; each metric summarised over the runs.

    ``run`` returns its figures by metric name; a metric missing from a run counts as NaN
    (not measurable that time), never as zero.
    """
    if warmup is not None:
        warmup()
    figures = [run() for _ in range(runs)]
    return {
        name: Summary.of([f.get(name, float("nan")) for f in figures], unit)
        for name, unit in units.items()
    }


def round_orders(variants: Sequence[Variant], runs: int) -> list[list[Variant]]:
    """The order of the variants in each of ``runs`` rounds, from Williams' design (a balanced
    Latin square): every ``n`` rounds put each variant in each position once, and over complete
    squares - ``n`` rounds for an even ``n``, ``2n`` (the square, then its rows reversed) for an
    odd one - each variant runs right after each other variant equally often. A plain rotation
    would keep the cyclic order: the same variant always right after the same neighbour, whose
    leftovers (WAL to write, a busy broker) it would meet every round. Fewer rounds than a
    complete square (the benchmark's default 3, for 3 or 4 impls) get its first rows: no
    variant in the same position twice, the neighbours varied but not balanced."""
    n = len(variants)
    if n == 0:
        return []
    first = [0]  # 0, 1, n-1, 2, n-2, ...
    low, high = 1, n - 1
    while len(first) < n:
        first.append(low if len(first) % 2 else high)
        if len(first) % 2:
            high -= 1
        else:
            low += 1
    rows = [[(i + r) % n for i in first] for r in range(n)]
    if n % 2:  # an odd square balances the neighbours only with its rows reversed after it
        rows += [row[::-1] for row in rows]
    return [[variants[i] for i in rows[k % len(rows)]] for k in range(runs)]


def repeat_interleaved(
    variants: Mapping[Variant, Callable[[], RunFigures]],
    *,
    runs: int,
    units: Units,
    warmups: Mapping[Variant, Callable[[], object]] | None = None,
    before_each: Callable[[], object] | None = None,
) -> dict[Variant, dict[str, Summary]]:
    """:func:`repeat` for variants whose figures are compared as ratios: every variant warms up,
    then ``runs`` rounds each run every variant once (:func:`round_orders`).

    A ratio of two variants measured minutes apart moves with the machine as much as with the
    code (docs/benchmarks.md, "Noise"): run one after the other, a slow spell lands on one
    variant's runs and not the other's. Interleaved, it lands on a run of each. ``before_each``
    runs before every timed run, outside it (e.g. emptying the tables).
    """
    for variant in variants:
        if warmups is not None and variant in warmups:
            warmups[variant]()
    figures: dict[Variant, list[RunFigures]] = {variant: [] for variant in variants}
    for order in round_orders(list(variants), runs):
        for variant in order:
            if before_each is not None:
                before_each()
            figures[variant].append(variants[variant]())
    return {
        variant: {
            name: Summary.of([f.get(name, float("nan")) for f in runs_of], unit)
            for name, unit in units.items()
        }
        for variant, runs_of in figures.items()
    }

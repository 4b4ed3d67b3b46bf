"""The interleaved runs the producer scenarios compare their impls by (bench/model.py)."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable

import pytest

from bench.model import RunFigures, repeat_interleaved, round_orders

UNITS = {"txn_per_s": "txn/s", "p50_ms": "ms"}


def test_each_round_runs_every_variant_once_in_an_order_of_its_own() -> None:
    orders = round_orders(["ours", "floor", "a", "b"], 6)
    assert len(orders) == 6
    for order in orders:
        assert sorted(order) == ["a", "b", "floor", "ours"]
    # with at least as many rounds as variants, each variant runs first once
    assert {order[0] for order in orders[:4]} == {"ours", "floor", "a", "b"}
    # no two rounds in a row alike
    for earlier, later in itertools.pairwise(orders):
        assert earlier != later


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
def test_over_the_square_every_variant_follows_every_other_equally_often(n: int) -> None:
    """No variant always runs right after the same neighbour (a plain rotation would keep
    the cyclic order), and each takes each position equally often."""
    rounds = n if n % 2 == 0 else 2 * n
    orders = round_orders(list(range(n)), rounds)
    after = Counter(pair for order in orders for pair in itertools.pairwise(order))
    assert set(after) == {(a, b) for a in range(n) for b in range(n) if a != b}
    assert len(set(after.values())) == 1
    for position in range(n):  # each n rounds: each variant in each position once
        for square in (orders[:n], orders[n:]):
            if square:
                assert Counter(order[position] for order in square) == dict.fromkeys(range(n), 1)


def test_no_variants_no_rounds() -> None:
    assert round_orders([], 3) == []


def test_runs_are_interleaved_after_every_warm_up() -> None:
    log: list[str] = []

    def timed(name: str, rate: float) -> Callable[[], RunFigures]:
        def run() -> RunFigures:
            log.append(f"run {name}")
            return {"txn_per_s": rate + len([x for x in log if x == f"run {name}"]), "p50_ms": 1}

        return run

    def warm(name: str) -> Callable[[], object]:
        return lambda: log.append(f"warm {name}")

    metrics = repeat_interleaved(
        {"ours": timed("ours", 100), "a": timed("a", 200)},
        runs=3,
        units=UNITS,
        warmups={"ours": warm("ours"), "a": warm("a")},
        before_each=lambda: log.append("clear"),
    )
    assert log == [
        "warm ours",
        "warm a",
        "clear",
        "run ours",
        "clear",
        "run a",
        "clear",
        "run a",
        "clear",
        "run ours",
        "clear",
        "run ours",
        "clear",
        "run a",
    ]
    # each variant summarised over its own runs only: 101, 102, 103 and 201, 202, 203
    assert metrics["ours"]["txn_per_s"].median == 102
    assert metrics["a"]["txn_per_s"].median == 202
    assert metrics["a"]["txn_per_s"].unit == "txn/s"


def test_a_metric_a_run_did_not_measure_is_nan_not_zero() -> None:
    metrics = repeat_interleaved({"ours": lambda: {"txn_per_s": 5.0}}, runs=2, units=UNITS)
    assert metrics["ours"]["txn_per_s"].median == 5.0
    assert math.isnan(metrics["ours"]["p50_ms"].median)


def test_a_failing_run_stops_the_comparison() -> None:
    def broken() -> RunFigures:
        raise RuntimeError("broker down")

    with pytest.raises(RuntimeError, match="broker down"):
        repeat_interleaved({"ours": lambda: {"txn_per_s": 1.0}, "a": broken}, runs=2, units=UNITS)

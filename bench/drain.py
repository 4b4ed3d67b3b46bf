"""Draining a preloaded backlog through relays, timed by a ``read_committed`` watcher.

The relay scenario (bench/relay_path.py) drives our relay processes and baseline B's polling
ones with it, bench/relay_c.py baseline C's Connect worker: each record is stamped when it
becomes visible, and promotions/s run from the first visible record to the last.
"""

from __future__ import annotations

import datetime as dt
import time
import urllib.request
from collections.abc import Sequence
from typing import Protocol

from bench.procs import Context, holds_partitions, unique
from bench.services import Services
from bench.watch import Arrivals, Watcher


def rates(
    arrivals: Arrivals, expected: int, started_ns: int, joined_ns: int | None = None
) -> dict[str, float]:
    """Promotions/s from the first to the last visible record; from the moment the last relay
    was assigned its partitions (``joined_ns``) to the last; and the start-up."""
    first = sorted(arrivals.first_arrival().values())
    figures = {
        "missing": float(max(0, expected - len(first))),
        "duplicates": float(arrivals.duplicates),
        "promotions_per_s": float("nan"),
        "after_join_per_s": float("nan"),
    }
    if len(first) < 2:
        return figures
    span = (first[-1] - first[0]) / 1e9
    if span > 0:
        figures["promotions_per_s"] = (len(first) - 1) / span
    if joined_ns is not None:
        after = [t for t in first if t > joined_ns]
        if len(after) > 1 and first[-1] > joined_ns:
            figures["after_join_per_s"] = len(after) / ((first[-1] - joined_ns) / 1e9)
    figures["startup_s"] = (first[0] - started_ns) / 1e9
    return figures


class Relay(Protocol):
    """What :func:`drain` drives: a relay process (:class:`Child`) or a Connect worker."""

    name: str

    def start(self) -> object: ...
    def stop(self) -> int | None: ...
    def log_text(self) -> str: ...
    def tail(self, lines: int = 30) -> str: ...


def last_assignment_ns(children: Sequence[Relay], before_ns: int) -> int | None:
    """When the last of the relays logged its non-empty assignment, on the monotonic clock,
    counting only assignments logged before ``before_ns`` (the drain's end: stopping one relay
    hands its partitions to the other, which logs a new assignment after the records were all
    visible); None when one never did."""
    offset = time.time_ns() - time.monotonic_ns()
    latest = None
    for child in children:
        last = None
        for line in child.log_text().splitlines():
            if holds_partitions(line):
                wall = dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                at = int(wall * 1e9) - offset
                if at <= before_ns:
                    last = at
        if last is None:
            return None
        latest = last if latest is None else max(latest, last)
    return latest


def drain(
    ctx: Context,
    services: Services,
    topic: str,
    expected: int,
    children: Sequence[Relay],
    *,
    group: bool = True,
    metric_ports: list[int] | None = None,
) -> dict[str, float]:
    """Start the watcher, then ``children``; wait until ``expected`` records are visible.

    With ``metric_ports`` (our relays' HTTP ports), the relays' own counters are read before
    they stop: held values evicted for the memory cap, and aborted Kafka transactions.
    """
    watcher = Watcher(ctx, unique("watch-relay"), services.bootstrap, topic).start()
    started = time.monotonic_ns()
    counters: dict[str, float] = {}
    try:
        for child in children:
            child.start()
        done = watcher.wait_for(expected, timeout=120 + expected / 500)
        drained = time.monotonic_ns()
        if metric_ports:
            counters = relay_counters(metric_ports)
    finally:
        for child in children:
            child.stop()
        arrivals = watcher.stop()
    if not done:
        tails = "\n".join(f"--- {c.name}\n{c.tail(10)}" for c in children)
        print(f"  relay: only {watcher.count} of {expected} visible; logs:\n{tails}", flush=True)
    joined = last_assignment_ns(children, drained) if group else None
    return {**rates(arrivals, expected, started, joined), **counters}


#: Relay metric -> our figure, summed over the relays.
RELAY_COUNTERS = {
    "outbox_relay_evicted_records_total": "evicted",
    "outbox_relay_kafka_txn_aborts_total": "aborts",
}


def relay_counters(ports: list[int]) -> dict[str, float]:
    """The relays' own counters from ``/metrics``, summed; NaN when one cannot be read."""
    totals = dict.fromkeys(RELAY_COUNTERS.values(), 0.0)
    for port in ports:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
                text = reply.read().decode()
        except OSError:
            return dict.fromkeys(RELAY_COUNTERS.values(), float("nan"))
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name in RELAY_COUNTERS:
                totals[RELAY_COUNTERS[name]] += float(value)
    return totals

"""Prometheus metrics of a checker, read from its own counters at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import fields
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from outbox.service_http import ServiceEndpoint

if TYPE_CHECKING:
    from checker.checker import Checker

HELP = {
    "checks": "Transactions asked about (answered by a producer).",
    "resolved_commit": "COMMIT ops the checker wrote (counted once the broker took them).",
    "resolved_rollback": "ROLLBACK ops the checker wrote (counted once the broker took them).",
    "unknown": "UNKNOWN answers.",
    "given_up": "GIVEN_UP ops the checker wrote (records dead-lettered). Alert on any.",
    "incomplete": (
        "COMMIT answers for transactions with half records missing, given up instead of "
        "delivered in part. Alert on any."
    ),
    "unreachable": "Checks that found no producer instance answering.",
    "breaker_trips": "Times a producer group's circuit breaker opened.",
    "held": (
        "Checks not made because which producer instances are live is not known (the registry "
        "topic not read to its end yet, refused, or not read to its end lately: its partition "
        "without a leader; see the checker's readiness)."
    ),
    "write_failures": "Ops and dead letters the broker did not take (ops are checked again).",
    "orphans": (
        "Undecided transactions taken up from put-back copies, their original half records "
        "removed by retention before this checker group read them (counted when first asked "
        "about, again after a restart)."
    ),
}


class CheckerCollector:
    def __init__(self, checker: Checker) -> None:
        self.checker = checker

    def collect(self) -> Iterator[Metric]:
        stats = self.checker.stats
        for f in fields(stats):
            yield CounterMetricFamily(
                f"outbox_checker_{f.name}", HELP[f.name], value=getattr(stats, f.name)
            )
        tracker = self.checker.tracker
        yield CounterMetricFamily(
            "outbox_checker_conflicts", "Later ops contradicting a decision.", tracker.conflicts
        )
        yield GaugeMetricFamily(
            "outbox_checker_pending", "Undecided transactions held.", len(tracker.pending)
        )
        oldest = min((p.first_ms for p in tracker.pending.values()), default=None)
        now_ms = self.checker.clock.now_ms()  # the records' clock (outbox.broker_clock)
        age = 0.0 if oldest is None else max(0.0, (now_ms - oldest) / 1000)
        yield GaugeMetricFamily(
            "outbox_checker_oldest_pending_age_seconds", "Age of the oldest undecided one.", age
        )


def serve(checker: Checker, port: int, host: str = "0.0.0.0") -> ServiceEndpoint:
    """Serve ``/healthz``, ``/readyz`` and ``/metrics`` on ``port`` until ``close()``."""
    registry = CollectorRegistry()
    registry.register(CheckerCollector(checker))
    return ServiceEndpoint(
        live=checker.live,
        ready=checker.ready,
        metrics=lambda: generate_latest(registry),
        host=host,
        port=port,
        name="outbox-checker-http",
    )

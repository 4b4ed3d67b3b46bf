"""Prometheus metrics of a relay: counters and gauges read from its state at scrape time, and
the Kafka-transaction commit latency as a histogram.

What to alert on: ``outbox_relay_oldest_pending_age_seconds`` growing past the checker's full
check window (decisions are not arriving), ``outbox_relay_parked_transactions`` above 0 for long
(a real topic is missing or refusing writes), any increase of ``outbox_relay_dead_lettered_total``
or ``outbox_relay_conflicting_ops_total``, ``outbox_relay_lag_records`` growing, and
``outbox_relay_unpaired_partitions`` above 0 (the half and op topics' partition counts differ).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from outbox.broker_clock import BrokerClock
from relay.accounting import Accounting
from relay.partitions import Partitions

#: (state counter, metric name, help)
COUNTERS = (
    ("promoted", "outbox_relay_promoted_total", "Committed transactions promoted."),
    ("dropped", "outbox_relay_dropped_total", "Rolled-back or given-up transactions dropped."),
    ("put_back", "outbox_relay_put_back_total", "Pending transactions re-appended (put back)."),
    ("duplicates", "outbox_relay_duplicate_ops_total", "Repeated ops with the same state."),
    (
        "conflicts",
        "outbox_relay_conflicting_ops_total",
        "Ops contradicting an earlier terminal op (ignored). Alert on any.",
    ),
    (
        "repeats",
        "outbox_relay_repeated_ops_total",
        "Terminal ops for transactions decided before, told by position (their first decision "
        "no longer remembered); never acted on.",
    ),
    ("evicted", "outbox_relay_evicted_records_total", "Held values dropped for the memory cap."),
)


class RelayMetrics:
    """One registry per relay, so several relays can live in one process (tests).

    Reads the relay's accounting and the partitions it holds at scrape time, on the HTTP
    thread: both are made to be read from there.
    """

    def __init__(self, accounting: Accounting, partitions: Partitions, clock: BrokerClock) -> None:
        self.registry = CollectorRegistry()
        self.commit_seconds = Histogram(
            "outbox_relay_kafka_txn_commit_seconds",
            "Time to commit one Kafka transaction (promotions + progress).",
            registry=self.registry,
            buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10),
        )
        self.registry.register(_Collector(accounting, partitions, clock))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Collector:
    def __init__(self, accounting: Accounting, partitions: Partitions, clock: BrokerClock) -> None:
        self.accounting = accounting
        self.partitions = partitions
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        accounting = self.accounting
        totals = accounting.totals()
        for key, name, text in COUNTERS:
            yield CounterMetricFamily(name, text, value=totals[key])
        yield CounterMetricFamily(
            "outbox_relay_dead_lettered_total",
            "Records sent to the dead-letter topic (undecodable, unknown schema, or an op whose "
            "half records are gone). Alert on any.",
            value=accounting.dead_lettered,
        )
        yield CounterMetricFamily(
            "outbox_relay_kafka_txn_aborts_total",
            "Kafka transactions aborted (their work is redone from the committed offsets).",
            value=accounting.aborts,
        )
        states = dict(self.partitions.states)
        pending = GaugeMetricFamily(
            "outbox_relay_pending_records", "Undecided half records held.", labels=["partition"]
        )
        held = GaugeMetricFamily(
            "outbox_relay_held_records",
            "Undecided half records whose values are in memory (at most max_held_records).",
            labels=["partition"],
        )
        oldest = GaugeMetricFamily(
            "outbox_relay_oldest_pending_age_seconds",
            "Broker-time age of the oldest undecided half record.",
            labels=["partition"],
        )
        now = self.clock.now_ms() / 1000
        for p, state in states.items():
            pending.add_metric([str(p)], state.pending_records)
            held.add_metric([str(p)], state.held)
            first = state.oldest_pending_ms()
            oldest.add_metric([str(p)], 0.0 if first is None else max(0.0, now - first / 1000))
        yield pending
        yield held
        yield oldest
        half, op = self.partitions.assigned
        yield GaugeMetricFamily(
            "outbox_relay_unpaired_partitions",
            "Half or op partitions this instance was given without the same-numbered partition "
            "of the other topic: the two topics' partition counts differ, and transactions on "
            "an unpaired half partition are not promoted. Alert on any.",
            value=len(half ^ op),
        )
        yield GaugeMetricFamily(
            "outbox_relay_parked_transactions",
            "Committed transactions waiting for their real topic (missing or refusing writes).",
            value=sum(len(s.parked) for s in states.values()),
        )
        lag = GaugeMetricFamily(
            "outbox_relay_lag_records",
            "Records between the committed offset and the end of the partition.",
            labels=["topic", "partition"],
        )
        for (topic, p), value in accounting.lag().items():
            lag.add_metric([topic, str(p)], value)
        yield lag

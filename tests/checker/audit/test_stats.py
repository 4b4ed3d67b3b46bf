"""Statistics: counts by state and decider, latency percentiles and histogram bins."""

from __future__ import annotations

import pytest

from checker.audit.bins import bin_index
from checker.audit.stats import statistics
from tests.checker.audit.scenario import Scenario

pytestmark = pytest.mark.integration  # starts Spark (a JVM), no Kafka


def test_counts_and_latencies_follow_the_transactions(spark) -> None:
    sc = Scenario()
    for i in range(10):  # decided 100*(i+1) ms after the half, promoted 50 ms later
        t = sc.txn(at=1_000)
        sc.op(t, "COMMIT", at=1_000 + 100 * (i + 1), by="checker" if i < 3 else "producer")
        sc.promote(t, at=1_050 + 100 * (i + 1))
    declined = sc.txn(at=1_000)
    sc.op(declined, "ROLLBACK", at=1_020)
    sc.txn(at=99_000)  # undecided, still within the window
    sc.txn(at=1_000, in_range=False)
    book, _ = sc.ledger(spark)

    figures = statistics(book, as_of_ms=100_000, grace_ms=5_000, window_ms=10_000)
    counts, latency = figures.counts, figures.latencies

    assert counts["transactions"] == 12 and counts["transactions_out_of_scope"] == 1
    assert counts["by_state"] == {"COMMIT": 10, "ROLLBACK": 1, "UNDECIDED": 1}
    assert counts["by_decider"] == {"checker": 3, "producer": 8}
    assert counts["by_state_and_decider"]["COMMIT"] == {"checker": 3, "producer": 7}
    assert counts["messages_committed"] == counts["messages_delivered"] == 10
    assert counts["pending_decision"] == 1 and counts["awaiting_promotion"] == 0
    assert latency["half_to_decision"] == {
        "count": 11,
        "p50": 500,
        "p90": 900,
        "p99": 1000,
        "max": 1000,
    }
    assert latency["decision_to_promotion"]["max"] == 50
    assert latency["half_to_promotion"]["count"] == 10

    bins = dict(figures.histograms["half_to_decision"])
    assert sum(bins.values()) == 11
    assert bins[bin_index(20)] == 1 and bin_index(1000) in bins


def test_a_resumed_transactions_latencies_and_pending_clock_start_at_its_resume(spark) -> None:
    """Its first half record, read or not (given up hours before, or gone with retention),
    is not where the protocol's latency starts again."""
    sc = Scenario()
    resumed = sc.txn(at=1_000)
    sc.op(resumed, "GIVEN_UP", at=20_000, by="checker")
    sc.put_back(resumed, 0, at=50_000)
    sc.op(resumed, "RESUMED", at=50_000, by="checker")
    sc.op(resumed, "COMMIT", at=50_300, by="checker")
    sc.promote(resumed, at=50_350)
    pending = sc.txn(at=1_000)
    sc.op(pending, "GIVEN_UP", at=20_000, by="checker")
    sc.op(pending, "RESUMED", at=95_000, by="checker")
    book, _ = sc.ledger(spark)

    figures = statistics(book, as_of_ms=100_000, grace_ms=5_000, window_ms=10_000)

    assert figures.latencies["half_to_decision"]["max"] == 300
    assert figures.latencies["half_to_promotion"]["max"] == 350
    assert figures.counts["pending_decision"] == 1  # resumed 5 s ago: not stuck, pending

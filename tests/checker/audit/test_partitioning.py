"""The audit's layout: sources and ledger partitioned by txn_id, so the ledger needs no shuffle."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from checker.audit import ledger as L
from checker.audit.partitioning import by_transaction
from tests.checker.audit.scenario import Scenario

pytestmark = pytest.mark.integration  # starts Spark (a JVM), no Kafka


@pytest.fixture
def no_broadcast(spark) -> Iterator[None]:
    """Sort-merge joins throughout, as on real volumes (tiny test frames would be broadcast,
    which needs no shuffle whatever the layout)."""
    before = spark.conf.get("spark.sql.autoBroadcastJoinThreshold")
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
    yield
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", before)


def _scenario() -> Scenario:
    sc = Scenario()
    for n in range(40):
        t = sc.txn(1 + n % 3, at=1_000 + n)
        sc.op(t, "COMMIT" if n % 4 else "ROLLBACK", at=2_000 + n)
        if n % 4:
            sc.promote(t, at=3_000 + n)
    return sc


def test_rows_of_one_transaction_share_a_partition(spark) -> None:
    frame = by_transaction(_scenario().frames(spark)["halves"])
    parts = frame.rdd.glom().map(lambda rows: {r["txn_id"] for r in rows}).collect()

    assert len(parts) == int(spark.conf.get("spark.sql.shuffle.partitions"))
    seen = [t for part in parts for t in part]
    assert len(seen) == len(set(seen)) == 40  # each transaction in exactly one partition


def test_the_ledger_of_laid_out_sources_shuffles_only_once(spark, no_broadcast) -> None:
    frames = {k: by_transaction(v).cache() for k, v in _scenario().frames(spark).items()}
    delivered = L.deliveries(frames["promoted"])
    txns = L.transactions(L.messages(frames["halves"]))
    book = L.ledger(txns, L.decisions(frames["ops"]), delivered).cache()

    assert book.count() == 40
    plan = _cached_plan_as_run(book._jdf.queryExecution().executedPlan().toString())
    # The only shuffles are the repartitions of by_transaction (the sources' and the ledger's
    # own after its full outer join); the planner added none for an aggregation, window or join.
    assert "ENSURE_REQUIREMENTS" not in plan, plan
    assert "SortMergeJoin" in plan, plan  # not broadcast: the layout is what was tested


def _cached_plan_as_run(text: str) -> str:
    """The final plan (as run, after adaptive execution) of the first cache in ``text``: from
    its ``== Final Plan ==`` line to its ``== Initial Plan ==`` line at the same indentation."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if "== Final Plan ==" in line)
    column = lines[first].index("== Final Plan ==")
    end = next(
        i for i in range(first + 1, len(lines)) if lines[i].find("== Initial Plan ==") == column
    )
    return "\n".join(lines[first:end])

"""Audits run one after another in one SparkSession: a notebook, a scheduler's long-lived
driver, this suite.

:func:`run_audit` works on any SparkSession (docs/audit.md shows it from Python). Each run
cached what it read, the ledger and its findings, and left them cached when it returned or
failed: the session's cache grew by sixteen frames an audit, their plans in the driver's
heap, until the driver ran out of it (the suite's 1 GiB session: "Java heap space" writing a
finding, some two hundred audits in). Now each run releases what it cached, and its findings
are the Parquet files it wrote - still the rows the summary counts after the topics move on.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from checker.audit.job import run_audit
from checker.audit.settings import AuditSettings
from outbox.protocol import OpState
from outbox.testing.stream import StreamTxn, StreamWriter
from tests.kafka_helpers import create_topic, unique

pytestmark = pytest.mark.integration


def _persisted(spark: Any) -> int:
    """RDDs the session keeps persisted: a cached DataFrame's, once it was computed."""
    return len(spark.sparkContext._jsc.getPersistentRDDs())


def _released(spark: Any, before: int) -> int:
    """The persisted count once the run's frames are gone (blocks are dropped asynchronously;
    the count drops at the unpersist call, so this waits briefly at most)."""
    deadline = time.monotonic() + 10
    while _persisted(spark) > before and time.monotonic() < deadline:
        time.sleep(0.2)
    return _persisted(spark)


def _lost_commits(w: StreamWriter, topic: str, n: int) -> list[StreamTxn]:
    """COMMITted transactions never promoted: ``lost`` to an audit past the grace period."""
    txns = [w.begin([(topic, b"k%d" % i, b"v")]) for i in range(n)]
    w.flush()
    for txn in txns:
        w.decide(txn, OpState.COMMIT)
    w.flush()
    return txns


def _writer(bootstrap: str, topic: str) -> StreamWriter:
    """A writer of transactions to ``topic`` (made here) on internal topics of their own."""
    create_topic(bootstrap, topic)
    return StreamWriter(bootstrap, prefix=unique("__outbox-repeated"), partitions=1)


def _settings(bootstrap: str, w: StreamWriter, out: Path, **overrides: Any) -> AuditSettings:
    return AuditSettings(
        bootstrap_servers=bootstrap,
        topic_prefix=w.topics.prefix,
        as_of="now+10m",
        out_dir=str(out),
        **overrides,
    )


@pytest.mark.scale  # audits one after another (~30 s): the scale stage
def test_audits_run_one_after_another_leave_nothing_cached_and_keep_their_findings(
    spark: Any, kafka_bootstrap: str, tmp_path: Path
) -> None:
    topic = unique("repeated")
    w = _writer(kafka_bootstrap, topic)
    first_lost = _lost_commits(w, topic, 2)
    before = _persisted(spark)

    first = run_audit(spark, _settings(kafka_bootstrap, w, tmp_path / "first"))
    assert _released(spark, before) == before, "the first audit left frames cached"
    later_lost = _lost_commits(w, topic, 3)  # the topics move on after the first audit
    w.close()
    for n in range(2):
        result = run_audit(spark, _settings(kafka_bootstrap, w, tmp_path / f"later-{n}"))
        assert result.counts["lost"] == len(first_lost) + len(later_lost)
        assert _released(spark, before) == before, f"audit {n + 2} left frames cached"

    # The first run's findings are what it counted and wrote, not a new read of the topics.
    assert first.counts["lost"] == len(first_lost)
    assert first.txn_ids("lost") == {t.txn_id for t in first_lost}
    assert first.findings["lost"].count() == len(first_lost)
    assert first.findings["duplicate"].count() == 0


def test_an_audit_that_fails_leaves_nothing_cached(
    spark: Any, kafka_bootstrap: str, tmp_path: Path
) -> None:
    """It fails writing its findings, after it read and judged (cached) everything."""
    topic = unique("repeated-failing")
    w = _writer(kafka_bootstrap, topic)
    _lost_commits(w, topic, 2)
    w.close()
    not_a_directory = tmp_path / "findings-here"
    not_a_directory.write_text("a file where the findings' directory should be\n")
    before = _persisted(spark)

    with pytest.raises(Exception, match="findings-here"):
        run_audit(
            spark,
            _settings(kafka_bootstrap, w, tmp_path / "out", parquet_dir=str(not_a_directory / "x")),
        )

    assert _released(spark, before) == before

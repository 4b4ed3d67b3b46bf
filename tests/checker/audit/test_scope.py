"""A COMMIT known from its op alone whose half records lie before what the audit read.

Its op names the half offsets; below the first offset read of their partition, the transaction
began before what was read (an offsets ``--from``, the op topic read whole; a time ``--from``
less ``--lookback``). Its real topics are not known - the real topics read are those the half
records read name - and it used to be judged anyway: its COMMIT was ``lost`` whenever no
transaction in the range wrote to the same real topic, and docs/audit.md tells the operator to
replay lost messages: a real duplicate. Now its messages missing are counted as unverifiable.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from checker.audit.job import run_audit
from checker.audit.settings import AuditSettings
from outbox.testing.stream import StreamTxn, StreamWriter
from tests.kafka_helpers import create_topic, unique

pytestmark = pytest.mark.integration


def _writer(bootstrap: str, *topics: str) -> StreamWriter:
    for topic in topics:
        create_topic(bootstrap, topic)
    return StreamWriter(bootstrap, prefix=unique("__outbox-scope"), partitions=1)


def _begin(w: StreamWriter, topic: str, n: int) -> list[StreamTxn]:
    txns = [w.begin([(topic, b"k%d" % i, b"v")]) for i in range(n)]
    w.flush()
    return txns


def test_offsets_from_a_later_half_offset_do_not_make_earlier_commits_lost(
    spark: Any, kafka_bootstrap: str, tmp_path: Any
) -> None:
    """``--from`` naming half offsets (an audit going on from where the last one ended): the
    op topic, not named, is read whole; its earlier COMMITs name half offsets below the range."""
    early, late = unique("early"), unique("late")
    w = _writer(kafka_bootstrap, early, late)
    w.commit_and_promote(_begin(w, early, 3))
    later = _begin(w, late, 2)
    w.commit_and_promote(later)
    w.close()
    start = {w.topics.half: {"0": min(later[0].half_offsets())}}

    result = run_audit(
        spark,
        AuditSettings(
            bootstrap_servers=kafka_bootstrap,
            topic_prefix=w.topics.prefix,
            start=json.dumps(start),
            as_of="now+10m",
            out_dir=str(tmp_path),
        ),
    )

    assert {n: c for n, c in result.counts.items() if c} == {}
    assert result.clean
    statistics = result.summary["statistics"]
    assert statistics["transactions"] == 3 + len(later)  # judged for all their ops show
    assert statistics["commits_unverifiable"] == 3


def test_a_transaction_begun_before_the_lookback_and_committed_in_the_range_is_not_lost(
    spark: Any, kafka_bootstrap: str, tmp_path: Any
) -> None:
    """A time ``--from``: a transaction begun before the lookback (a checker down for longer
    than the check window, a producer holding its transaction open) and committed in the
    range."""
    early, late = unique("early"), unique("late")
    w = _writer(kafka_bootstrap, early, late)
    begun_early = _begin(w, early, 3)
    time.sleep(2.0)
    start_ms = int(time.time() * 1000)
    w.commit_and_promote(begun_early)
    in_range = _begin(w, late, 2)
    w.commit_and_promote(in_range)
    w.close()

    result = run_audit(
        spark,
        AuditSettings(
            bootstrap_servers=kafka_bootstrap,
            topic_prefix=w.topics.prefix,
            start=str(start_ms),
            lookback_s=0.5,
            as_of="now+10m",
            out_dir=str(tmp_path),
        ),
    )

    assert {n: c for n, c in result.counts.items() if c} == {}
    statistics = result.summary["statistics"]
    assert statistics["transactions"] == len(begun_early) + len(in_range)
    assert statistics["commits_unverifiable"] == len(begun_early)

"""Topics that lost records to retention: the audit judges what they still hold in full.

Retention is played by ``delete_records`` (what retention does, at once). The default audit,
``--from earliest``, of a system older than its half topic's retention (7 days) used to read
every op left on the op topic (14 days) as in range: each COMMIT whose half and real records
retention had removed was ``lost`` (and docs/audit.md tells the operator to replay those: real
duplicates), each promoted record whose half and op were gone a ``phantom``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from checker.audit.job import run_audit
from checker.audit.settings import AuditSettings
from outbox.protocol import OpState
from outbox.testing.stream import StreamTxn, StreamWriter
from tests.kafka_helpers import create_topic, read_to_end, remove_up_to_the_end, unique

pytestmark = pytest.mark.integration


@pytest.mark.scale  # retention and compaction under an audit (~40 s together): the scale stage
def test_what_retention_removed_is_neither_lost_nor_phantom(
    spark: Any, kafka_bootstrap: str, tmp_path
) -> None:
    orders, archive = unique("orders"), unique("archive")
    for topic in (orders, archive):
        create_topic(kafka_bootstrap, topic)
    w = StreamWriter(kafka_bootstrap, prefix=unique("__outbox-retained"), partitions=1)
    topics = w.topics

    def committed(topic: str, n: int, *, promote: bool = True) -> list[StreamTxn]:
        txns = [w.begin([(topic, b"k%d" % i, b"v")]) for i in range(n)]
        w.flush()
        for t in txns:
            w.decide(t, OpState.COMMIT)
        w.flush()
        if promote:
            for t in txns:
                w.promote(t)
            w.flush()
        time.sleep(0.05)  # what follows is stamped later
        return txns

    # half and op records gone, the promoted records kept (a topic kept longer): no phantom
    committed(archive, 2)
    for topic in (topics.half, topics.op):
        remove_up_to_the_end(kafka_bootstrap, topic, 0)
    # half and promoted records gone, the ops kept (the op topic keeps 14 days): not lost
    committed(orders, 2)
    # ... but one the relay found no half records for (it was down for longer than the half
    # topic's retention) and dead-lettered its COMMIT: never delivered, lost
    [refused] = committed(orders, 1, promote=False)
    w.refuse(refused, OpState.COMMIT, "half records gone (retention)")
    remove_up_to_the_end(kafka_bootstrap, topics.half, 0)
    # half records and ops kept, the promoted records gone (the real topic's retention is
    # shorter, or its segments roll sooner): not lost, nothing shows whether they arrived
    faded = committed(orders, 2)
    remove_up_to_the_end(kafka_bootstrap, orders, 0)
    # what every topic holds in full is judged as ever
    kept = committed(orders, 2)
    [never_promoted] = committed(orders, 1, promote=False)
    w.close()

    settings = AuditSettings(
        bootstrap_servers=kafka_bootstrap,
        topic_prefix=topics.prefix,
        as_of="now+10m",
        out_dir=str(tmp_path),
        real_topics=(archive,),  # no half record left names it
    )
    result = run_audit(spark, settings)

    assert result.txn_ids("lost") == {never_promoted.txn_id, refused.txn_id}
    assert {n: c for n, c in result.counts.items() if c} == {"lost": 2}
    statistics = result.summary["statistics"]
    # the transactions whose half records are left; those known from their ops alone, their
    # half records removed, are out of scope
    assert statistics["transactions"] == len(faded) + len(kept) + 2
    # what retention may have taken from the real topic is counted, not reported
    assert statistics["commits_unverifiable"] == len(faded)
    assert statistics["records_unverifiable"] == 2  # the archive's: no half or op left
    since = result.summary["parameters"]["complete_since_ms"]
    assert set(since) == {topics.op, orders}


@pytest.mark.scale  # see above
def test_a_record_compaction_replaced_on_a_real_topic_is_not_lost(
    spark: Any, kafka_bootstrap: str, tmp_path
) -> None:
    """Entity events keyed by id on a compacted topic: once a later transaction's record of the
    same key is promoted, the cleaner may remove the earlier one. That one is not lost; a
    COMMIT whose record never came is, even where its key has an older record."""
    customers = unique("customers")
    quick_compaction = {
        "cleanup.policy": "compact",
        "segment.ms": "100",
        "min.cleanable.dirty.ratio": "0.001",
        "min.compaction.lag.ms": "0",
    }
    create_topic(kafka_bootstrap, customers, config=quick_compaction)
    w = StreamWriter(kafka_bootstrap, prefix=unique("__outbox-compacted"), partitions=1)

    def commit(key: bytes, *, promote: bool = True) -> StreamTxn:
        t = w.begin([(customers, key, b"state of " + key)])
        w.flush()
        w.decide(t, OpState.COMMIT)
        w.flush()
        if promote:
            w.promote(t)
            w.flush()
        time.sleep(0.2)  # past segment.ms: the next record rolls a new segment
        return t

    replaced = commit(b"customer-1")
    commit(b"customer-1")
    commit(b"customer-2")
    [never_promoted] = [commit(b"customer-2", promote=False)]
    commit(b"customer-3")  # rolls the segment above: the cleaner may clean those before it
    w.close()
    deadline = time.monotonic() + 90
    while sum(m.key() == b"customer-1" for m in read_to_end(kafka_bootstrap, customers)) > 1:
        assert time.monotonic() < deadline, "the cleaner did not compact the topic"
        time.sleep(1)

    settings = AuditSettings(
        bootstrap_servers=kafka_bootstrap,
        topic_prefix=w.topics.prefix,
        as_of="now+10m",
        out_dir=str(tmp_path),
    )
    result = run_audit(spark, settings)

    assert result.txn_ids("lost") == {never_promoted.txn_id}
    assert replaced.txn_id not in result.txn_ids("lost")
    assert {n: c for n, c in result.counts.items() if c} == {"lost": 1}

"""What the topics no longer hold: the audit judges nothing retention has taken away.

Retention removes records from the head of each partition: the half topic's after 7 days, the
op topic's after 14, a real topic's after whatever its owner set. An audit reading what is
left (the default ``--from earliest`` on a system older than that) would take a committed
transaction whose half and real records are gone, known from its op alone, for ``lost`` (and
the operator, following docs/audit.md, would replay it: a real duplicate), and a promoted
record whose half and op records are gone for a ``phantom``. So:

- a transaction known from its op alone is judged only when the half offsets its op names are
  still on the half topic (at or past the partition's log start): offsets, no clocks
  (:func:`checker.audit.ledger.ledger`);
- a record of a transaction neither topic shows is a phantom only when stamped after the op
  topic's partitions that lost records were complete (:func:`complete_since`);
- ``lost`` and ``partial`` judge a COMMIT only when each of its real topics held every record
  since its decision; the others are counted as unverifiable, not reported as violations
  (:mod:`checker.audit.findings.delivery`).

A partition that lost records is complete from its first record left, read at its head (its
broker times rise with its offsets; a real topic's CreateTime comes from the relays' clocks).
One that shows no record there (every record gone, or only aborted ones and markers at its
head) is complete from ``as_of - retention.ms``: time retention removes only records older.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from checker.audit.plan import TopicRead

#: Records read from the head of each partition that lost some: the first ones may be aborted
#: records or transaction markers, which a read_committed read skips.
HEAD_RECORDS = 64

#: Per topic and partition, (log start, log end) offsets
#: (:func:`checker.audit.metadata.held_offsets`).
Held = Mapping[str, Mapping[int, tuple[int, int]]]


def complete_since(
    read: Callable[[TopicRead], DataFrame],
    held: Held,
    *,
    retention_ms: Mapping[str, int],
    as_of_ms: int,
) -> dict[str, int]:
    """Per topic that lost records from the head of a partition, the latest time (Unix ms)
    from which such a partition holds every record. Topics that lost nothing are left out.

    ``read`` reads one topic as :func:`checker.audit.source.read_topic` does (read_committed);
    ``retention_ms`` is each topic's ``retention.ms`` (absent or negative: unlimited).
    """
    trimmed = {t: {p: se for p, se in ps.items() if se[0] > 0} for t, ps in held.items()}
    trimmed = {t: ps for t, ps in trimmed.items() if ps}
    firsts = _heads(read, held, trimmed)
    since: dict[str, int] = {}
    for topic, partitions in trimmed.items():
        kept = retention_ms.get(topic, -1)
        unseen = as_of_ms - kept if kept >= 0 else as_of_ms
        since[topic] = max(firsts.get((topic, p), unseen) for p in partitions)
    return since


def _heads(
    read: Callable[[TopicRead], DataFrame], held: Held, trimmed: Held
) -> dict[tuple[str, int], int]:
    """The broker time of the first record left of each trimmed partition that shows one."""
    frames = []
    for topic, partitions in sorted(trimmed.items()):
        heads = {p: (s, min(e, s + HEAD_RECORDS)) for p, (s, e) in partitions.items() if s < e}
        if not heads:
            continue
        every = held[topic]
        # every partition named (Spark wants them all); the others read nothing
        starts = {str(p): heads[p][0] if p in heads else e for p, (_, e) in every.items()}
        ends = {str(p): heads[p][1] if p in heads else e for p, (_, e) in every.items()}
        options = {
            "startingOffsets": json.dumps({topic: starts}),
            "endingOffsets": json.dumps({topic: ends}),
        }
        frames.append(
            read(TopicRead(topic, options)).select(
                "topic", "partition", F.unix_millis(F.col("timestamp")).alias("ts_ms")
            )
        )
    if not frames:
        return {}
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    rows = union.groupBy("topic", "partition").agg(F.min("ts_ms").alias("first_ms")).collect()
    return {(str(r["topic"]), int(r["partition"])): int(r["first_ms"]) for r in rows}

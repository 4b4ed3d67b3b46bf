"""Where each topic still holds every record: the audit judges nothing the topics have lost.

Retention removes records from the head of each partition: the half topic's after 7 days, the
op topic's after 14, a real topic's after whatever its owner set. An audit reading what is
left would take a committed transaction whose half and real records are gone, known from its
op alone, for ``lost`` (and the operator, following docs/audit.md, would replay it: a real
duplicate), and a promoted record whose half and op records are gone for a ``phantom``. So:

- the range starts no earlier than the moment from which the half and op topics are complete
  (:func:`judged_from`): with ``--from earliest`` on a system older than its retention, that
  is where the audit starts, not at the first record left;
- ``lost`` and ``partial`` judge a transaction only when every real topic it names was
  complete when it was decided (:mod:`checker.audit.findings.delivery`).

A partition that lost records is complete from its first record left: its broker times rise
with its offsets (the internal topics use LogAppendTime; a real topic's CreateTime comes from
the relay's clock). A partition that lost every record holds nothing that could be judged,
and one that lost none sets no bound.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from checker.audit.bounds import AtTime, Bound, Earliest
from checker.audit.plan import TopicRead

#: Records read from the head of each partition that lost some: the first one may be an
#: aborted record or a transaction marker, which a read_committed read skips.
HEAD_RECORDS = 64

#: Per topic and partition, (log start, log end) offsets
#: (:func:`checker.audit.metadata.held_offsets`).
Held = Mapping[str, Mapping[int, tuple[int, int]]]


def complete_since(read: Callable[[TopicRead], DataFrame], held: Held) -> dict[str, int]:
    """Per topic that lost records from a partition still holding some, the latest broker time
    of such a partition's first record left (Unix ms). Topics that lost nothing are left out.

    ``read`` reads one topic as :func:`checker.audit.source.read_topic` does (read_committed).
    """
    frames = []
    for topic, partitions in sorted(held.items()):
        heads = {p: (s, min(e, s + HEAD_RECORDS)) for p, (s, e) in partitions.items() if 0 < s < e}
        if not heads:
            continue
        # every partition named (Spark wants them all); the others read nothing
        starts = {str(p): heads[p][0] if p in heads else e for p, (_, e) in partitions.items()}
        ends = {str(p): heads[p][1] if p in heads else e for p, (_, e) in partitions.items()}
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
    firsts = union.groupBy("topic", "partition").agg(F.min("ts_ms").alias("first_ms"))
    rows = firsts.groupBy("topic").agg(F.max("first_ms").alias("since_ms")).collect()
    return {str(r["topic"]): int(r["since_ms"]) for r in rows}


def judged_from(start: Bound, since_ms: int | None) -> Bound:
    """The range's start: ``start``, moved to ``since_ms`` (where the half and op topics are
    complete) when it lies before it. Offsets the operator named are left as named."""
    if since_ms is None:
        return start
    if isinstance(start, Earliest):
        return AtTime(since_ms)
    if isinstance(start, AtTime) and start.ms < since_ms:
        return AtTime(since_ms)
    return start

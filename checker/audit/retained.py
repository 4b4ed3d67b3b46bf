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
head) is complete from now minus ``retention.ms``: time retention removes only records older.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from checker.audit.errors import AuditSourceError
from checker.audit.metadata import held_offsets, is_compacted, topic_configs
from checker.audit.plan import TopicRead
from checker.audit.settings import AuditSettings
from checker.audit.source import AuditInputs, read_topic, union_all

log = logging.getLogger(__name__)

#: The topic settings the audit reads: how long records stay, and whether and when the
#: cleaner may replace a key's records.
CONFIGS = ("cleanup.policy", "retention.ms", "min.compaction.lag.ms")

#: Records read from the head of each partition that lost some: the first ones may be aborted
#: records or transaction markers, which a read_committed read skips.
HEAD_RECORDS = 64

#: Per topic and partition, (log start, log end) offsets
#: (:func:`checker.audit.metadata.held_offsets`).
Held = Mapping[str, Mapping[int, tuple[int, int]]]


@dataclass(frozen=True)
class Retained:
    """What the topics still hold, learnt once their records are read."""

    #: Per half-topic partition read from its log start, that log start: an op naming half
    #: offsets below it names records retention removed.
    half_log_starts: dict[int, int] = field(default_factory=dict)
    #: Per half-topic partition the audit read records of, the first offset it read (its log
    #: start when it read from there): a COMMIT known from its op alone whose half offsets
    #: all lie below it began before what was read, its real topics not known. None: not
    #: learnt (no such COMMIT is told apart).
    half_read_from: dict[int, int] | None = None
    #: Per op or real topic that lost records, from when it holds every record (Unix ms).
    complete_since_ms: dict[str, int] = field(default_factory=dict)
    #: Per compacted real topic, before when (Unix ms) the cleaner may have replaced a record.
    compactable_before_ms: dict[str, int] = field(default_factory=dict)
    #: What could not be learnt, and why (no DescribeConfigs permission?), else None.
    unknown: str | None = None


def retained(
    spark: Any, settings: AuditSettings, inputs: AuditInputs, *, now_ms: int, earliest: bool
) -> Retained:
    """Ask Kafka what the topics still hold. Call it once ``inputs`` are read (cached): a record
    retention removes meanwhile is then below the starts listed, never taken for a missing one.
    ``earliest``: the half topic was read from its start (``--from earliest``).

    What cannot be learnt (no permission to describe the topics' settings, a topic deleted or
    grown since it was read) is taken as unknown, with a warning and
    ``Retained.unknown`` saying why: the findings are then judged as if nothing was removed.
    It raises nothing of its own: the sources were read, so Kafka was there a moment ago.
    """
    names = settings.topics
    real = list(inputs.real_topics)
    # (under --from earliest every partition was read from its start: no Spark job needed,
    # unless the starts cannot be listed)
    first_read = {} if earliest else first_offsets_read(inputs.halves)
    try:
        held = held_offsets(
            spark,
            settings.bootstrap_servers,
            settings.kafka,
            {t: inputs.partitions[t] for t in [names.half, names.op, *real]},
            timeout_s=settings.metadata_timeout_s,
        )
    except AuditSourceError as err:
        return Retained(
            half_read_from=first_offsets_read(inputs.halves) if earliest else first_read,
            unknown=_unknown("the topics' log start offsets", err),
        )
    unknown: str | None = None
    try:
        configs = topic_configs(
            spark,
            settings.bootstrap_servers,
            settings.kafka,
            [names.op, *real],
            CONFIGS,
            timeout_s=settings.metadata_timeout_s,
        )
    except AuditSourceError as err:
        # without them: no topic taken for compacted, retention taken as unlimited (the
        # bounds then rest on the first records left alone)
        unknown = _unknown("the topics' settings (DescribeConfigs)", err)
        configs = {}
    try:
        since = complete_since(
            lambda r: read_topic(spark, settings, r),
            {t: held[t] for t in [names.op, *real] if t in held},
            retention_ms={t: int(c.get("retention.ms", "-1")) for t, c in configs.items()},
            now_ms=now_ms,
        )
    except Exception as err:  # a topic deleted or grown since: Spark's errors have no base
        return Retained(
            half_read_from=read_from(held.get(names.half, {}), first_read, earliest=earliest),
            unknown=_unknown("the first records left of trimmed partitions", err),
        )
    half_held = held.get(names.half, {})
    return Retained(
        half_log_starts=read_from_start(half_held, first_read, earliest=earliest),
        half_read_from=read_from(half_held, first_read, earliest=earliest),
        complete_since_ms=since,
        compactable_before_ms={
            t: now_ms - int(configs[t].get("min.compaction.lag.ms", "0"))
            for t in real
            if is_compacted(configs.get(t, {}))
        },
        unknown=unknown,
    )


def _unknown(what: str, err: Exception) -> str:
    text = f"{what} could not be read: {err}"
    log.warning("%s; taken as unknown (docs/audit.md, retention)", text)
    return text


def first_offsets_read(halves: DataFrame) -> dict[int, int]:
    """The first offset read of each half partition the audit read records of."""
    rows = halves.groupBy("partition").agg(F.min("offset").alias("first")).collect()
    return {int(r["partition"]): int(r["first"]) for r in rows}


def read_from_start(
    held: Mapping[int, tuple[int, int]], first_read: Mapping[int, int], *, earliest: bool
) -> dict[int, int]:
    """The log starts of the half partitions the audit read from their start: all of them when
    it read from ``earliest`` (the starts are listed after the read, so nothing below them was
    left unread), else those whose first record read is at the start (a transaction marker or
    an aborted put-back copy there hides it: such a partition is left out). Where it read from
    later (a time ``--from``), a transaction's put-back copy may lie before what was read and
    its op name original offsets retention removed - it is still judged by its op (its real
    topics not known: :func:`read_from`)."""
    return {
        p: start
        for p, (start, end) in held.items()
        if earliest
        or (p in first_read and first_read[p] <= start)
        or (p not in first_read and start == end)
    }


def read_from(
    held: Mapping[int, tuple[int, int]], first_read: Mapping[int, int], *, earliest: bool
) -> dict[int, int]:
    """The first offset the audit read of each half partition: its log start when it read from
    ``earliest``, else its first record read. Below it lie records before the range (a time
    ``--from`` less the lookback, or the offsets ``--from`` names), transaction markers and
    aborted copies, or records retention removed. A partition of which nothing was read is
    left out: where its read began is not known (the ledger takes what its ops name as
    unread too)."""
    if earliest:
        return {p: start for p, (start, _) in held.items()}
    return dict(first_read)


def complete_since(
    read: Callable[[TopicRead], DataFrame],
    held: Held,
    *,
    retention_ms: Mapping[str, int],
    now_ms: int,
) -> dict[str, int]:
    """Per topic that lost records from the head of a partition, the latest time (Unix ms)
    from which such a partition holds every record. Topics that lost nothing are left out.

    ``read`` reads one topic as :func:`checker.audit.source.read_topic` does (read_committed);
    ``retention_ms`` is each topic's ``retention.ms`` (absent or negative: unlimited);
    ``now_ms`` the wall clock (not the audit's ``--as-of``: retention removes by the brokers'
    clocks, now).
    """
    trimmed = {t: {p: se for p, se in ps.items() if se[0] > 0} for t, ps in held.items()}
    trimmed = {t: ps for t, ps in trimmed.items() if ps}
    firsts = _heads(read, held, trimmed)
    since: dict[str, int] = {}
    for topic, partitions in trimmed.items():
        kept = retention_ms.get(topic, -1)
        unseen = now_ms - kept if kept >= 0 else now_ms
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
                "topic", "partition", "offset", F.unix_millis(F.col("timestamp")).alias("ts_ms")
            )
        )
    if not frames:
        return {}
    union = union_all(frames)
    # the first record's time, not the least: a real topic's CreateTime need not rise
    first = F.min_by(F.col("ts_ms"), F.col("offset")).alias("first_ms")
    rows = union.groupBy("topic", "partition").agg(first).collect()
    return {(str(r["topic"]), int(r["partition"])): int(r["first_ms"]) for r in rows}

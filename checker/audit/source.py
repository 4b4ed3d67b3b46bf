"""Reading the topics (and the evidence table) into typed, cached DataFrames.

The half topic is read first: the real topics to read are those its records name. Every topic
is read ``read_committed`` (put-back copies and promotions are written in Kafka transactions)
from a little before the range to its end (:mod:`checker.audit.plan`); records stamped after
the audit's clock are dropped, so that what is judged is one consistent moment even while
producers, relay and checker go on writing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from checker.audit import records
from checker.audit.cache_scope import Cache
from checker.audit.errors import AuditConfigError
from checker.audit.evidence_source import read_evidence, read_horizon
from checker.audit.metadata import topic_partitions
from checker.audit.partitioning import by_transaction
from checker.audit.plan import TopicRead, plan_read
from checker.audit.settings import AuditSettings, Resolved

#: The columns Spark's Kafka source gives with ``includeHeaders=true``.
RAW_SCHEMA = T.StructType(
    [
        T.StructField("key", T.BinaryType()),
        T.StructField("value", T.BinaryType()),
        T.StructField("topic", T.StringType()),
        T.StructField("partition", T.IntegerType()),
        T.StructField("offset", T.LongType()),
        T.StructField("timestamp", T.TimestampType()),
        T.StructField("timestampType", T.IntegerType()),
        T.StructField(
            "headers",
            T.ArrayType(
                T.StructType(
                    [T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType())]
                )
            ),
        ),
    ]
)


@dataclass
class AuditInputs:
    """Everything one audit judges, typed and cached."""

    halves: DataFrame
    ops: DataFrame
    promoted: DataFrame
    dead_letters: DataFrame
    unreadable: DataFrame
    evidence: DataFrame | None = None
    #: The evidence table's pruning horizon (Unix ms); None when never pruned or not read.
    evidence_horizon_ms: int | None = None
    partitions: dict[str, int] = field(default_factory=dict)
    real_topics: list[str] = field(default_factory=list)
    missing_real_topics: list[str] = field(default_factory=list)


def read_topic(spark: Any, settings: AuditSettings, read: TopicRead) -> DataFrame:
    """The raw rows of one topic, over the range ``read`` names."""
    reader = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", settings.bootstrap_servers)
        .option("kafka.isolation.level", "read_committed")
        .option("subscribe", read.topic)
        .option("includeHeaders", "true")
        # Retention or compaction removing records while they are read is not a finding.
        .option("failOnDataLoss", "false")
    )
    for key, value in settings.kafka.items():
        reader = reader.option(f"kafka.{key}", str(value))
    for key, value in read.options.items():
        reader = reader.option(key, value)
    frame: DataFrame = reader.load()
    return frame


def empty_raw(spark: Any) -> DataFrame:
    frame: DataFrame = spark.createDataFrame([], RAW_SCHEMA)
    return frame


def load_inputs(
    spark: Any, settings: AuditSettings, resolved: Resolved, *, cache: Cache
) -> AuditInputs:
    """Read the half, op, real and dead-letter topics and the evidence table, each cached with
    ``cache`` (the half, op and real records in the layout every later step wants:
    :mod:`checker.audit.partitioning`).

    Raises:
        AuditConfigError: the half or op topic does not exist (wrong prefix?).
        AuditSourceError: Kafka or the evidence database could not be reached.
    """
    names = settings.topics
    internal = [names.half, names.op, names.dead_letter]
    partitions = _partitions(spark, settings, internal)
    for topic in (names.half, names.op):
        if topic not in partitions:
            raise AuditConfigError(
                f"topic {topic} does not exist at {settings.bootstrap_servers}; "
                "check --topic-prefix and --bootstrap-servers"
            )

    def plan(topic: str) -> TopicRead:
        return plan_read(
            topic,
            partitions[topic],
            resolved.start,
            resolved.end,
            lookback_ms=settings.lookback_ms,
        )

    def cache_by_transaction(frame: DataFrame) -> DataFrame:
        return cache(by_transaction(frame))

    cut = resolved.as_of_ms
    half_read = plan(names.half)
    halves = cache_by_transaction(
        records.halves(read_topic(spark, settings, half_read), half_read.in_range, as_of_ms=cut)
    )
    op_read = plan(names.op)
    ops = cache_by_transaction(
        records.ops(read_topic(spark, settings, op_read), op_read.in_range, as_of_ms=cut)
    )

    wanted = sorted(set(_named_real_topics(halves)) | set(settings.real_topics))
    wanted = [t for t in wanted if not names.is_internal(t)]
    partitions.update(_partitions(spark, settings, wanted))
    present = [t for t in wanted if t in partitions]
    promoted_raw = [
        records.promoted(read_topic(spark, settings, r), r.in_range, as_of_ms=cut)
        for r in (plan(t) for t in present)
    ]
    promoted = cache_by_transaction(
        union_all(promoted_raw)
        if promoted_raw
        else records.promoted(empty_raw(spark), half_read.in_range, as_of_ms=cut)
    )
    if names.dead_letter in partitions:
        dead_raw = read_topic(spark, settings, plan(names.dead_letter))
    else:
        dead_raw = empty_raw(spark)
    dead_letters = cache(records.dead_letters(dead_raw, as_of_ms=cut, op_topic=names.op))
    unreadable = cache(
        records.unreadable(halves, names.half)
        .unionByName(records.unreadable(ops, names.op))
        .unionByName(records.unreadable(promoted, "real"))
    )
    evidence, horizon = _evidence(spark, settings, cache)
    return AuditInputs(
        halves=halves,
        ops=ops,
        promoted=promoted,
        dead_letters=dead_letters,
        unreadable=unreadable,
        evidence=evidence,
        evidence_horizon_ms=horizon,
        partitions=partitions,
        real_topics=present,
        missing_real_topics=[t for t in wanted if t not in partitions],
    )


def _evidence(
    spark: Any, settings: AuditSettings, cache: Cache
) -> tuple[DataFrame | None, int | None]:
    """The evidence rows (cached) and the table's pruning horizon; nothing without a URL."""
    if not settings.evidence_url:
        return None, None
    where: dict[str, Any] = {
        "table": settings.evidence_table,
        "user": settings.evidence_user,
        "password": settings.evidence_password,
    }
    rows = cache(read_evidence(spark, settings.evidence_url, **where))
    return rows, read_horizon(spark, settings.evidence_url, **where)


def _partitions(spark: Any, settings: AuditSettings, topics: list[str]) -> dict[str, int]:
    if not topics:
        return {}
    return topic_partitions(
        spark,
        settings.bootstrap_servers,
        settings.kafka,
        topics,
        timeout_s=settings.metadata_timeout_s,
    )


def _named_real_topics(halves: DataFrame) -> list[str]:
    rows = (
        halves.filter(F.col("problem").isNull() & F.col("real_topic").isNotNull())
        .select("real_topic")
        .distinct()
        .collect()
    )
    return [r["real_topic"] for r in rows]


def union_all(frames: list[DataFrame]) -> DataFrame:
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return result


def typed(inputs: AuditInputs) -> Mapping[str, DataFrame]:
    """The readable rows of each source, as the ledger functions take them."""
    return {
        "halves": records.readable(inputs.halves),
        "ops": records.readable(inputs.ops),
        "promoted": records.readable(inputs.promoted),
    }

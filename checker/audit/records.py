"""Raw Kafka rows (Spark's Kafka source schema) -> typed half, op, promoted and dead-letter rows.

Pure DataFrame expressions, no Python UDFs: executors need no Python code of ours, and the
parsing runs at Spark's speed. Each record that cannot be read the way docs/protocol.md says
(unknown schema version, missing or malformed field) keeps its place with a ``problem`` text,
so the audit reports it instead of guessing; readable rows have ``problem`` null.

Every function takes the source's columns (key, value, topic, partition, offset, timestamp,
headers) and returns the same row count or fewer (tombstones and records stamped after the
audit's clock are dropped).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from checker.audit.plan import InRange
from outbox.protocol.dead_letter import DeadLetterHeader
from outbox.protocol.headers import (
    FIELD_SEPARATOR,
    HALF_FIELDS,
    SCHEMA_VERSION,
    Header,
)
from outbox.protocol.states import CheckBy, DecidedBy, OpState

UUID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"

OP_SCHEMA = T.StructType(
    [
        T.StructField("v", T.LongType()),
        T.StructField("txn_id", T.StringType()),
        T.StructField("state", T.StringType()),
        T.StructField("producer_group", T.StringType()),
        T.StructField(
            "half",
            T.StructType(
                [
                    T.StructField("partition", T.IntegerType()),
                    T.StructField("offsets", T.ArrayType(T.LongType())),
                ]
            ),
        ),
        T.StructField("message_count", T.IntegerType()),
        T.StructField("decided_by", T.StringType()),
        T.StructField("decided_at_ms", T.LongType()),
        T.StructField("reason", T.StringType()),
    ]
)


#: The column that holds a record's headers as a map (see :func:`with_header_map`).
HEADER_MAP = "header_map"


def with_header_map(raw: DataFrame) -> DataFrame:
    """Add the headers as a map, built once per record: three times faster than searching the
    header array once per header.

    A header may repeat (Kafka allows it); the last value wins, as in
    :func:`outbox.protocol.half.decode_half`. For that the session is set to
    ``spark.sql.mapKeyDedupPolicy=LAST_WIN`` (Spark's default fails the query instead).
    """
    raw.sparkSession.conf.set("spark.sql.mapKeyDedupPolicy", "LAST_WIN")
    return raw.withColumn(HEADER_MAP, F.map_from_entries(F.col("headers")))


def header(name: str) -> Column:
    """The value (bytes) of header ``name``; null when there is none."""
    return F.try_element_at(F.col(HEADER_MAP), F.lit(name))


def header_text(name: str) -> Column:
    return header(name).cast("string")


def header_int(name: str, kind: str = "long") -> Column:
    """The header as a number; null when absent or not decimal digits."""
    return header_text(name).try_cast(kind)


#: The column that holds the fields of a version-2 half record's ``outbox-half`` header (null
#: on version 1 and on records without one); see :func:`with_half_fields`.
HALF_FIELDS_COLUMN = "half_fields"


def with_half_fields(df: DataFrame) -> DataFrame:
    """Split ``outbox-half`` once per record (after :func:`with_header_map`). A record with the
    header is read as version 2 whatever else it carries, as :func:`decode_half` reads it; a
    null value reads as empty (an unknown version), not as absent."""
    packed = F.coalesce(header(Header.HALF).cast("string"), F.lit(""))
    present = F.map_contains_key(F.col(HEADER_MAP), F.lit(Header.HALF.value))
    fields = F.split(packed, FIELD_SEPARATOR.decode(), -1)
    return df.withColumn(HALF_FIELDS_COLUMN, F.when(present, fields))


def half_text(name: str, v1_header: str) -> Column:
    """A field of a half record of either version: from ``outbox-half`` when it has one (an
    empty optional field reads as null), else from the version-1 header ``v1_header``."""
    packed = F.try_element_at(F.col(HALF_FIELDS_COLUMN), F.lit(HALF_FIELDS.index(name) + 1))
    return F.when(
        F.col(HALF_FIELDS_COLUMN).isNotNull(), F.when(packed != F.lit(""), packed)
    ).otherwise(header_text(v1_header))


def half_int(name: str, v1_header: str, kind: str = "long") -> Column:
    return half_text(name, v1_header).try_cast(kind)


def in_range_column(spec: InRange) -> Column:
    """True for rows (with ``ts_ms``, ``partition``, ``offset``) inside the audited range."""
    condition: Column = F.lit(True)
    if spec.start_ms is not None:
        condition = condition & (F.col("ts_ms") >= F.lit(spec.start_ms))
    if spec.end_ms is not None:
        condition = condition & (F.col("ts_ms") < F.lit(spec.end_ms))
    if spec.start_offsets:
        first = F.try_element_at(literal_map(spec.start_offsets), F.col("partition"))
        condition = condition & (first.isNull() | (F.col("offset") >= first))
    if spec.end_offsets:
        past = F.try_element_at(literal_map(spec.end_offsets), F.col("partition"))
        condition = condition & (past.isNull() | (F.col("offset") < past))
    return condition


def literal_map(values: Mapping[Any, Any]) -> Column:
    """``values`` as a map column, for looking a row's partition or topic up in it."""
    return F.create_map(*[F.lit(x) for k, v in sorted(values.items()) for x in (k, v)])


def _located(raw: DataFrame, spec: InRange, as_of_ms: int) -> DataFrame:
    """Broker time in ms, the in-range flag, and nothing stamped after the audit's clock."""
    located = raw.withColumn("ts_ms", F.unix_millis(F.col("timestamp")))
    located = located.filter(F.col("ts_ms") <= F.lit(as_of_ms))
    return with_header_map(located.withColumn("in_range", in_range_column(spec)))


def _first_problem(*checks: tuple[Column, Column | str]) -> Column:
    """The text of the first failed check, null when all pass."""
    result: Column = F.lit(None).cast("string")
    for failed, text in reversed(checks):
        message = F.lit(text) if isinstance(text, str) else text
        result = F.when(failed, message).otherwise(result)
    return result


def halves(raw: DataFrame, spec: InRange, *, as_of_ms: int) -> DataFrame:
    """One row per half record (put-back copies included, ``origin_offset`` set on those).

    ``check_by`` is what answers its transaction's checks, from ``outbox-check-by``:
    ``evidence`` when the header is absent (as :func:`decode_half` reads it), any other value
    as written (``listener``, or one of a newer producer), so that it is never taken for
    evidence.
    """
    df = with_half_fields(_located(raw, spec, as_of_ms)).select(
        F.when(F.col(HALF_FIELDS_COLUMN).isNotNull(), F.element_at(F.col(HALF_FIELDS_COLUMN), 1))
        .otherwise(header_text(Header.SCHEMA_VERSION))
        .alias("schema_version"),
        # null without outbox-half (F.size alone gives -1 for null when ANSI mode is off)
        F.when(F.col(HALF_FIELDS_COLUMN).isNotNull(), F.size(HALF_FIELDS_COLUMN)).alias(
            "field_count"
        ),
        half_text("txn_id", Header.TXN_ID).alias("txn_id"),
        half_text("producer_group", Header.PRODUCER_GROUP).alias("producer_group"),
        half_text("real_topic", Header.REAL_TOPIC).alias("real_topic"),
        header(Header.REAL_KEY).alias("real_key"),
        half_int("message_index", Header.MESSAGE_INDEX, "int").alias("message_index"),
        half_int("message_count", Header.MESSAGE_COUNT, "int").alias("message_count"),
        half_int("check_count", Header.CHECK_COUNT, "int").alias("check_count"),
        F.coalesce(header_text(Header.CHECK_BY), F.lit(CheckBy.EVIDENCE.value)).alias("check_by"),
        header_int(Header.ORIGIN_OFFSET).alias("origin_offset"),
        header_text(Header.ORIGIN_OFFSET).alias("origin_text"),
        "partition",
        "offset",
        "ts_ms",
        "in_range",
    )
    version = F.col("schema_version")
    packed = F.col("field_count").isNotNull()
    problem = _first_problem(
        (version.isNull(), f"no {Header.HALF.value} or {Header.SCHEMA_VERSION.value} header"),
        (
            ~packed & (version == F.lit("2")),
            f"{Header.SCHEMA_VERSION.value} 2 without an {Header.HALF.value} header",
        ),
        (
            # "2" only in outbox-half, "1" only in outbox-schema-version (as decode_half reads)
            version != F.when(packed, F.lit("2")).otherwise(F.lit("1")),
            F.concat(F.lit("unknown schema version "), version),
        ),
        (
            F.coalesce(F.col("field_count"), F.lit(len(HALF_FIELDS))) != F.lit(len(HALF_FIELDS)),
            F.concat(
                F.lit(f"header {Header.HALF.value} has "),
                F.col("field_count").cast("string"),
                F.lit(f" fields, not {len(HALF_FIELDS)}"),
            ),
        ),
        # named by field (docs/protocol.md maps each to its version-1 header)
        (~F.coalesce(F.col("txn_id").rlike(UUID_PATTERN), F.lit(False)), "bad txn_id"),
        (F.col("producer_group").isNull(), "no producer_group"),
        (F.col("real_topic").isNull(), "no real_topic"),
        (F.col("message_index").isNull(), "bad message_index"),
        (
            F.col("origin_text").isNotNull() & F.col("origin_offset").isNull(),
            f"bad {Header.ORIGIN_OFFSET.value} header",
        ),
    )
    return df.withColumn("problem", problem).drop("schema_version", "field_count", "origin_text")


def ops(raw: DataFrame, spec: InRange, *, as_of_ms: int) -> DataFrame:
    """One row per op record; tombstones (null values) are left out."""
    located = _located(raw, spec, as_of_ms).filter(F.col("value").isNotNull())
    doc = F.from_json(F.col("value").cast("string"), OP_SCHEMA)
    df = located.select(
        F.col("key").cast("string").alias("key_text"),
        doc.alias("doc"),
        "partition",
        "offset",
        "ts_ms",
        "in_range",
    ).select(
        "doc.v",
        "key_text",
        "doc.txn_id",
        "doc.state",
        "doc.producer_group",
        F.col("doc.half.partition").alias("half_partition"),
        F.col("doc.half.offsets").alias("half_offsets"),
        F.size(F.col("doc.half.offsets")).alias("message_count"),
        "doc.decided_by",
        "doc.decided_at_ms",
        "doc.reason",
        "partition",
        "offset",
        "ts_ms",
        "in_range",
    )
    states = [s.value for s in OpState]
    deciders = [d.value for d in DecidedBy]
    problem = _first_problem(
        (F.col("v").isNull(), "not an op document (no JSON object with a v field)"),
        (
            F.col("v") != F.lit(SCHEMA_VERSION),
            F.concat(F.lit("unknown schema version "), F.col("v").cast("string")),
        ),
        (~F.coalesce(F.col("txn_id").rlike(UUID_PATTERN), F.lit(False)), "bad txn_id"),
        (F.col("key_text") != F.col("txn_id"), "key differs from txn_id"),
        (~F.coalesce(F.col("state").isin(states), F.lit(False)), "unknown state"),
        (~F.coalesce(F.col("decided_by").isin(deciders), F.lit(False)), "bad decided_by"),
        (F.col("producer_group").isNull(), "no producer_group"),
        (
            F.col("half_partition").isNull()
            | F.col("half_offsets").isNull()
            | F.exists(F.col("half_offsets"), lambda o: o.isNull() | (o < 0)),
            "bad half field",
        ),
        (F.col("decided_at_ms").isNull(), "no decided_at_ms"),
    )
    return df.withColumn("problem", problem).drop("v", "key_text")


def promoted(raw: DataFrame, spec: InRange, *, as_of_ms: int) -> DataFrame:
    """One row per record of a real topic; ``txn_id`` is null on records the relay did not
    write (the topic may have other producers)."""
    df = _located(raw, spec, as_of_ms).select(
        "topic",
        "partition",
        "offset",
        "ts_ms",
        "key",
        header_text(Header.TXN_ID).alias("txn_id"),
        header_text(Header.PRODUCER_GROUP).alias("producer_group"),
        header_int(Header.MESSAGE_INDEX, "int").alias("message_index"),
        "in_range",
    )
    problem = _first_problem(
        (
            F.col("txn_id").isNotNull() & F.col("message_index").isNull(),
            f"bad {Header.MESSAGE_INDEX.value} header",
        ),
    )
    return df.withColumn("problem", problem)


def dead_letters(raw: DataFrame, *, as_of_ms: int, op_topic: str | None = None) -> DataFrame:
    """Dead letters that name a transaction: the given-up messages, with the reason; and the
    ops the relay refused (dead letters from ``op_topic``: their half records were gone),
    whose transaction the op at ``source_partition``/``source_offset`` names (their own key
    and value may have been omitted)."""
    located = with_header_map(raw.withColumn("ts_ms", F.unix_millis(F.col("timestamp"))))
    source = header_text(DeadLetterHeader.SOURCE_TOPIC)
    from_op = F.coalesce(source == F.lit(op_topic), F.lit(False)) if op_topic else F.lit(False)
    return (
        with_half_fields(located.filter(F.col("ts_ms") <= F.lit(as_of_ms)))
        .select(
            half_text("txn_id", Header.TXN_ID).alias("txn_id"),
            half_int("message_index", Header.MESSAGE_INDEX, "int").alias("message_index"),
            header_text(DeadLetterHeader.REASON).alias("reason"),
            source.alias("source_topic"),
            header_int(DeadLetterHeader.SOURCE_PARTITION, "int").alias("source_partition"),
            header_int(DeadLetterHeader.SOURCE_OFFSET).alias("source_offset"),
            from_op.alias("refused_op"),
            "partition",
            "offset",
            "ts_ms",
        )
        .filter(F.col("txn_id").isNotNull() | F.col("refused_op"))
    )


def unreadable(records: DataFrame, topic: str) -> DataFrame:
    """The in-range rows of ``records`` (from one of the functions above) with a problem."""
    txn = F.col("txn_id") if "txn_id" in records.columns else F.lit(None).cast("string")
    return records.filter(F.col("problem").isNotNull() & F.col("in_range")).select(
        F.col("topic") if "topic" in records.columns else F.lit(topic).alias("topic"),
        "partition",
        "offset",
        "ts_ms",
        txn.alias("txn_id"),
        "problem",
    )


def readable(records: DataFrame) -> DataFrame:
    return records.filter(F.col("problem").isNull()).drop("problem")

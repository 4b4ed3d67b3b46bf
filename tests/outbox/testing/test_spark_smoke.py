"""Spark's official Kafka source reads exactly what was produced."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Producer

from tests.kafka_helpers import create_topic, unique

pytestmark = pytest.mark.integration


def test_spark_batch_read_counts_exactly_the_records_produced(
    kafka_bootstrap: str, spark: Any
) -> None:
    topic = unique("spark")
    create_topic(kafka_bootstrap, topic, partitions=3)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(1234):
        producer.produce(topic, key=str(i % 17).encode(), value=f"v{i}".encode())
    assert producer.flush(30) == 0

    frame = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka_bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )
    per_partition = {
        r["partition"]: r["count"] for r in frame.groupBy("partition").count().collect()
    }

    assert sum(per_partition.values()) == 1234
    assert set(per_partition) <= {0, 1, 2}
    assert frame.selectExpr("CAST(value AS STRING) AS v").distinct().count() == 1234

"""The end-to-end generator's processes each commit their share, numbered apart, and every
commit they report is in the database and stamped (bench/generator.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from confluent_kafka import Consumer, TopicPartition

from bench.generator import GeneratorSpec, LoadGenerator
from bench.producer_path import outbox_settings
from bench.workload import create_schema, orders
from outbox import ensure_topics, migrations
from tests.kafka_helpers import create_topic, unique

pytestmark = pytest.mark.integration


def half_records(bootstrap: str, topic: str) -> int:
    """How many records the half topic holds (one per transaction of one message)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("count")})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in partitions
        )
    finally:
        consumer.close()


def test_two_processes_share_the_rate_and_every_commit_is_stamped_and_stored(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'e2e.db'}"
    migrations.upgrade(url)
    engine = sa.create_engine(url)
    create_schema(engine)
    topic, prefix = unique("gen"), unique("__outbox-gen")
    create_topic(kafka_bootstrap, topic)
    ensure_topics(outbox_settings(kafka_bootstrap, prefix))
    spec = GeneratorSpec("ours", url, topic, kafka_bootstrap, prefix, pool_size=2)
    generator = LoadGenerator(spec, processes=2)
    generator.start()
    try:
        assert len(generator.pids()) == 2
        # A warm-up, as every bench scenario has: a process's first transactions wait for its
        # producer's idempotence id, which a broker just started answers with "coordinator load
        # in progress" for up to seconds; a cold 1.5 s run then sheds part of its schedule.
        warm = generator.run(rate=20, seconds=1.0, workers=4)
        before = time.monotonic_ns()
        run = generator.run(rate=40, seconds=1.5, workers=4)
        after = time.monotonic_ns()
    finally:
        generator.close()
    assert generator.pids() == []
    assert warm.errors == [] and run.errors == [] and run.shed == 0
    # 40/s for 1.5 s, 30 a process: each process issued its own share
    assert len(run.committed) == 60
    assert {seq.split(".")[0] for seq in run.committed} == {"0", "1"}
    assert len(set(run.committed)) == len(run.committed)
    # every commit stamped on the machine's one monotonic clock, inside the run
    assert set(run.commits) == set(run.committed)
    assert all(before < stamp < after for stamp in run.commits.values())
    with engine.connect() as conn:
        stored = conn.execute(sa.select(sa.func.count()).select_from(orders)).scalar()
    engine.dispose()
    # the warm-up's commits are numbered apart from the run's, and stored like them
    assert not set(warm.committed) & set(run.committed)
    assert stored == 60 + len(warm.committed)
    half = outbox_settings(kafka_bootstrap, prefix).topics.half
    assert half_records(kafka_bootstrap, half) == 60 + len(warm.committed)


def test_a_process_that_cannot_build_its_side_fails_the_start_by_name(tmp_path: Path) -> None:
    spec = GeneratorSpec(
        "baseline_b", f"sqlite:///{tmp_path}/missing/dir/x.db", "t", "127.0.0.1:9", "p", 1
    )
    generator = LoadGenerator(spec, processes=1)
    try:
        with pytest.raises(RuntimeError, match=r"generator process 0 failed to start: .*unable"):
            generator.start()
    finally:
        generator.close()

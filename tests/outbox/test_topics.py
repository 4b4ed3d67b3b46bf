"""``ensure_topics`` on a real broker: the op topic is created bounded by its retention, and an
existing one that is not (the old ``compact`` alone, or kept for less than the half records it
decides) is refused with the command that fixes it in place; a producer on internal topics nobody
ensured refuses its transactions, in every public form, before anything is sent or committed."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import ConfigResource
from sqlalchemy.orm import sessionmaker

from outbox import OutboxProducer, OutboxSettings, TopicMismatchError, ensure_topics
from outbox.errors import KafkaOperationError
from outbox.protocol import TopicNames
from tests.kafka_helpers import admin_client, create_topic, set_topic_config, unique, watermarks
from tests.outbox.forms import refused_in_every_other_form
from tests.producer_fixtures import order_ids, place_order, settings_on_a_fresh_prefix

pytestmark = pytest.mark.integration

DAY_MS = 24 * 3600 * 1000


def settings_for(bootstrap: str, prefix: str, **overrides: int) -> OutboxSettings:
    return OutboxSettings(
        bootstrap_servers=bootstrap,
        producer_group="g",
        topic_prefix=prefix,
        partitions=2,
        **overrides,
    )


def configs(bootstrap: str, topic: str) -> dict[str, str]:
    admin = admin_client(bootstrap)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    found = admin.describe_configs([resource])[resource].result(30)
    return {key: entry.value for key, entry in found.items()}


def alter(bootstrap: str, topic: str, **values: str) -> None:
    """Set topic configs (``retention_ms=...`` for ``retention.ms``), then wait until the broker
    describes them: an alteration reaches the broker's metadata a moment after it returns."""
    wanted = {key.replace("_", "."): value for key, value in values.items()}
    for key, value in wanted.items():
        set_topic_config(bootstrap, topic, key, value)
    deadline = time.monotonic() + 30
    while {k: configs(bootstrap, topic)[k] for k in wanted} != wanted:
        assert time.monotonic() < deadline, f"{topic} never showed {wanted}"
        time.sleep(0.1)


def fix_command(bootstrap: str, topic: str, retention_ms: int) -> str:
    return (
        f"kafka-configs.sh --bootstrap-server {bootstrap} --alter --entity-type topics "
        f"--entity-name {topic} --add-config "
        f"'cleanup.policy=[compact,delete],retention.ms={retention_ms}'"
    )


def test_ensure_topics_creates_the_op_topic_compacted_and_deleted_after_its_retention(
    kafka_bootstrap: str,
) -> None:
    settings = settings_for(
        kafka_bootstrap,
        unique("__outbox-retention"),
        min_compaction_lag_ms=2 * DAY_MS,
        half_retention_ms=3 * DAY_MS,
        op_retention_ms=10 * DAY_MS,
    )
    names = settings.topics
    assert set(ensure_topics(settings)) == set(names.all())
    op = configs(kafka_bootstrap, names.op)
    assert set(op["cleanup.policy"].split(",")) == {"compact", "delete"}
    assert (op["retention.ms"], op["min.compaction.lag.ms"]) == (str(10 * DAY_MS), str(2 * DAY_MS))
    assert configs(kafka_bootstrap, names.half)["retention.ms"] == str(3 * DAY_MS)
    # and the topics it created pass its own check
    assert ensure_topics(settings) == []


def test_ensure_topics_refuses_an_op_topic_compacted_only_and_gives_the_fix(
    kafka_bootstrap: str,
) -> None:
    # Given an op topic as the releases before created it: compacted only, so it never shrinks
    names = TopicNames(unique("__outbox-old-op"))
    create_topic(
        kafka_bootstrap,
        names.op,
        partitions=2,
        config={
            "cleanup.policy": "compact",
            "min.compaction.lag.ms": str(7 * DAY_MS),
            "message.timestamp.type": "LogAppendTime",
        },
    )
    settings = settings_for(kafka_bootstrap, names.prefix)
    # When ensure_topics runs, then it refuses it, naming the policy found and wanted and the fix
    with pytest.raises(TopicMismatchError) as refused:
        ensure_topics(settings)
    message = str(refused.value)
    assert f"{names.op} has cleanup.policy=compact, expected compact,delete" in message
    assert f"fix: {fix_command(kafka_bootstrap, names.op, 14 * DAY_MS)}" in message
    # When the operator runs the fix (what that kafka-configs.sh command sets)
    alter(
        kafka_bootstrap,
        names.op,
        cleanup_policy="compact,delete",
        retention_ms=str(14 * DAY_MS),
    )
    # Then the topic is accepted as it is
    assert ensure_topics(settings) == []


def test_ensure_topics_refuses_an_op_topic_kept_for_less_than_the_half_records(
    kafka_bootstrap: str,
) -> None:
    # Given a half topic an operator keeps for 30 days, and an op topic kept for 14
    names = TopicNames(unique("__outbox-long-half"))
    create_topic(
        kafka_bootstrap,
        names.half,
        partitions=2,
        config={"retention.ms": str(30 * DAY_MS), "message.timestamp.type": "LogAppendTime"},
    )
    settings = settings_for(kafka_bootstrap, names.prefix)
    # When ensure_topics creates the op topic with the default retention, then it says that
    # decisions would go before the half records they decide, and how to keep them as long
    with pytest.raises(TopicMismatchError) as refused:
        ensure_topics(settings)
    message = str(refused.value)
    assert (
        f"{names.op}: op retention.ms={14 * DAY_MS} is shorter than the half topic's "
        f"retention.ms={30 * DAY_MS}"
    ) in message
    assert f"fix: {fix_command(kafka_bootstrap, names.op, 30 * DAY_MS)}" in message
    alter(kafka_bootstrap, names.op, retention_ms=str(30 * DAY_MS))
    assert ensure_topics(settings) == []


def test_ensure_topics_refuses_an_op_retention_shorter_than_its_compaction_lag(
    kafka_bootstrap: str,
) -> None:
    settings = settings_for(kafka_bootstrap, unique("__outbox-short-op"), half_retention_ms=DAY_MS)
    names = settings.topics
    ensure_topics(settings)
    # Given an op topic whose retention someone cut below the audit window (7 days)
    alter(kafka_bootstrap, names.op, retention_ms=str(2 * DAY_MS))
    with pytest.raises(TopicMismatchError) as refused:
        ensure_topics(settings)
    message = str(refused.value)
    assert (
        f"{names.op}: op retention.ms={2 * DAY_MS} is shorter than its "
        f"min.compaction.lag.ms={7 * DAY_MS} (the audit window)"
    ) in message
    assert f"fix: {fix_command(kafka_bootstrap, names.op, 14 * DAY_MS)}" in message


def test_a_producer_on_internal_topics_never_ensured_refuses_before_sending_or_committing(
    kafka_bootstrap: str, session_factory: sessionmaker, engine: sa.Engine, db_url: str
) -> None:
    # Given a prefix nobody ran `topics ensure` for (the broker would auto-create a topic a
    # client produces to, with its own defaults)
    settings = settings_on_a_fresh_prefix(kafka_bootstrap)
    names = settings.topics
    real = unique("never-ensured-orders")
    admin = admin_client(kafka_bootstrap)
    attempted: list[str] = []

    def order(producer: OutboxProducer) -> None:
        place_order(producer, session_factory, real, "same-key", attempted)

    with OutboxProducer(settings) as producer:
        # When a transaction runs, it is refused, naming the missing topic and the fix
        with pytest.raises(KafkaOperationError) as refused:
            order(producer)
        assert f"internal topic {names.half} does not exist" in str(refused.value)
        assert "kafka-outbox topics ensure" in str(refused.value)
        # in every other form too
        refused_in_every_other_form(
            producer,
            settings,
            session_factory,
            db_url,
            real,
            [b"k0", b"k1", b"k2", b"k3"],
            attempted,
            KafkaOperationError,
            match=f"internal topic {names.half} does not exist",
        )
        # and with the half topic made by hand but no op topic, the op topic is named
        create_topic(kafka_bootstrap, names.half, partitions=3)
        deadline = time.monotonic() + 30
        while names.half not in admin.list_topics(timeout=10).topics:  # all: no auto-creation
            assert time.monotonic() < deadline, f"{names.half} never showed in the metadata"
            time.sleep(0.1)
        with pytest.raises(KafkaOperationError, match=f"internal topic {names.op} does not exist"):
            order(producer)

    # Then no order was committed, no record was sent, and no topic was auto-created
    assert len(attempted) == 4  # the context manager twice, the decorator, asyncio
    assert not set(attempted) & set(order_ids(engine))
    existing = admin.list_topics(timeout=10).topics
    assert names.op not in existing and real not in existing
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": unique("marks")})
    try:
        marks = [watermarks(consumer, TopicPartition(names.half, p)) for p in range(3)]
    finally:
        consumer.close()
    assert marks == [(0, 0)] * 3

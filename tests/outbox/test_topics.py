"""``ensure_topics`` on a real broker: the op topic is created bounded by its retention, and an
existing one that is not (the old ``compact`` alone, or kept for less than the half records it
decides) is refused with the command that fixes it in place."""

from __future__ import annotations

import time

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from outbox import OutboxSettings, TopicMismatchError, ensure_topics
from outbox.protocol import TopicNames
from tests.kafka_helpers import create_topic, set_topic_config, unique

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
    admin = AdminClient({"bootstrap.servers": bootstrap})
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

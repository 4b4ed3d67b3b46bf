"""Creating the internal topics, and refusing ones that exist with settings we cannot use."""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
)

from outbox.errors import KafkaOperationError, TopicMismatchError
from outbox.protocol.topics import TopicNames, topic_settings
from outbox.settings import OutboxSettings

log = logging.getLogger(__name__)

#: Settings that must match on an existing topic; others (retention etc.) are the operator's.
_CHECKED_CONFIGS = ("cleanup.policy",)


def ensure_topics(
    settings: OutboxSettings, *, replication_factor: int = -1, timeout: float = 30.0
) -> list[str]:
    """Create the missing internal topics; verify the existing ones.

    Returns:
        The names of the topics created by this call.

    Raises:
        TopicMismatchError: an existing topic has another partition count (half and op must
            match ``settings.partitions``) or cleanup policy; the message says what differs.
        KafkaOperationError: the broker could not be reached or refused the creation.
    """
    names = settings.topics
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers, **_admin_extra(settings)})
    existing = _existing_partitions(admin, names, timeout)
    wanted = {t: _partitions(names, t, settings) for t in names.all()}
    missing = [t for t in names.all() if t not in existing]
    if missing:
        _create(admin, names, settings, missing, wanted, replication_factor, timeout)
        _wait_for_leaders(admin, missing, timeout)
    present = [t for t in names.all() if t in existing]
    problems = [p for t in present for p in _problems(admin, names, settings, t, existing, timeout)]
    if problems:
        raise TopicMismatchError(
            "internal topics exist with settings the outbox cannot use: "
            + "; ".join(problems)
            + ". Recreate them, or point topic_prefix at a fresh set."
        )
    return missing


def _partitions(names: TopicNames, topic: str, settings: OutboxSettings) -> int:
    return settings.partitions if topic in (names.half, names.op, names.dead_letter) else 1


def _admin_extra(settings: OutboxSettings) -> dict[str, Any]:
    # Security settings of the producer apply to the admin client too.
    return {k: v for k, v in settings.kafka.items() if k.startswith(("security.", "sasl.", "ssl."))}


def _existing_partitions(admin: AdminClient, names: TopicNames, timeout: float) -> dict[str, int]:
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as err:
        raise KafkaOperationError(
            f"cannot list topics: {err.args[0]}; is the broker reachable?", err.args[0]
        ) from err
    return {
        name: len(topic.partitions)
        for name, topic in metadata.topics.items()
        if name in names.all() and topic.error is None
    }


def _create(
    admin: AdminClient,
    names: TopicNames,
    settings: OutboxSettings,
    missing: list[str],
    wanted: dict[str, int],
    replication_factor: int,
    timeout: float,
) -> None:
    new = [
        NewTopic(
            t,
            num_partitions=wanted[t],
            replication_factor=replication_factor,
            config=topic_settings(names, t, min_compaction_lag_ms=settings.min_compaction_lag_ms),
        )
        for t in missing
    ]
    for topic, future in admin.create_topics(new, request_timeout=timeout).items():
        try:
            future.result(timeout)
            log.info("created internal topic %s", topic)
        except KafkaException as err:
            if err.args[0].name() != "TOPIC_ALREADY_EXISTS":  # a concurrent ensure won the race
                raise KafkaOperationError(
                    f"cannot create topic {topic}: {err.args[0]}", err.args[0]
                ) from err


def _wait_for_leaders(admin: AdminClient, topics: list[str], timeout: float) -> None:
    """Return once every partition of ``topics`` has a leader, so the topics are usable."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        metadata = admin.list_topics(timeout=timeout)
        found = [metadata.topics.get(t) for t in topics]
        if all(
            t is not None and t.error is None and all(p.leader >= 0 for p in t.partitions.values())
            for t in found
        ):
            return
        time.sleep(0.1)
    raise KafkaOperationError(f"topics {topics} were created but have no leaders after {timeout} s")


def _problems(
    admin: AdminClient,
    names: TopicNames,
    settings: OutboxSettings,
    topic: str,
    existing: dict[str, int],
    timeout: float,
) -> list[str]:
    problems = []
    if topic in (names.half, names.op) and existing[topic] != settings.partitions:
        problems.append(
            f"{topic} has {existing[topic]} partitions, expected {settings.partitions} "
            "(half and op topics must have equal partition counts)"
        )
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    config = admin.describe_configs([resource], request_timeout=timeout)[resource].result(timeout)
    expected = topic_settings(names, topic, min_compaction_lag_ms=settings.min_compaction_lag_ms)
    for key in _CHECKED_CONFIGS:
        actual = config[key].value if key in config else None
        if actual != expected[key]:
            problems.append(f"{topic} has {key}={actual}, expected {expected[key]}")
    return problems

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

from outbox import kafka_clients
from outbox.errors import KafkaOperationError, TopicMismatchError
from outbox.protocol.topics import (
    OP_CLEANUP_POLICY,
    TopicNames,
    op_retention_problem,
    required_op_retention_ms,
    topic_settings,
)
from outbox.settings import OutboxSettings
from outbox.topic_metadata import read_topic_metadata

log = logging.getLogger(__name__)

#: Settings that must match on an existing topic; others (retention etc.) are the operator's,
#: except the op topic's retention, checked against the half topic's (:func:`_op_problems`).
_CHECKED_CONFIGS = ("cleanup.policy",)


def ensure_topics(
    settings: OutboxSettings, *, replication_factor: int = -1, timeout: float = 30.0
) -> list[str]:
    """Create the missing internal topics; verify the existing ones.

    Returns:
        The names of the topics created by this call.

    Raises:
        TopicMismatchError: an existing topic has another partition count (half and op must
            match ``settings.partitions``) or cleanup policy, or the op topic is not deleted by
            age (``cleanup.policy=compact,delete``) with a ``retention.ms`` at least the half
            topic's and its ``min.compaction.lag.ms``; the message says what differs and, for
            the op topic, gives the ``kafka-configs.sh`` command that fixes it in place.
        KafkaOperationError: the broker could not be reached or refused the creation.
        ForkedWithLockHeldError: called in a process forked with a lock held that its Kafka
            clients need (:mod:`outbox.fork_checks`).
    """
    names = settings.topics
    admin = kafka_clients.admin(
        {"bootstrap.servers": settings.bootstrap_servers, **_admin_extra(settings)}
    )
    try:
        existing = _existing_partitions(admin, names, timeout, settings.bootstrap_servers)
        wanted = {t: _partitions(names, t, settings) for t in names.all()}
        missing = [t for t in names.all() if t not in existing]
        if missing:
            _create(admin, names, settings, missing, wanted, replication_factor, timeout)
            _wait_for_leaders(admin, missing, timeout, settings.bootstrap_servers)
        problems = _verify(admin, names, settings, existing, timeout)
    finally:
        admin.poll(0)  # its librdkafka log (e.g. why the broker was not reached), before it goes
    if problems:
        raise TopicMismatchError(
            "internal topics exist with settings the outbox cannot use: "
            + "; ".join(problems)
            + ". Where no fix is given, recreate the topics, or point topic_prefix at a fresh set."
        )
    return missing


def _verify(
    admin: AdminClient,
    names: TopicNames,
    settings: OutboxSettings,
    existing: dict[str, int],
    timeout: float,
) -> list[str]:
    """What is wrong with the topics that were there before this call.

    The op topic's retention is checked against the half topic's whenever either was there
    before (the two created now have the settings, checked in :class:`OutboxSettings`).
    """
    present = [t for t in names.all() if t in existing]
    pair = [names.op, names.half] if names.op in existing or names.half in existing else []
    configs = _describe(admin, list(dict.fromkeys([*present, *pair])), timeout)
    problems = [p for t in present for p in _problems(names, settings, t, existing, configs)]
    if pair:
        problems += _op_problems(names, settings, configs[names.op], configs[names.half])
    return problems


def _partitions(names: TopicNames, topic: str, settings: OutboxSettings) -> int:
    co_partitioned = (names.half, names.op, names.dead_letter, names.state)
    return settings.partitions if topic in co_partitioned else 1


def _admin_extra(settings: OutboxSettings) -> dict[str, Any]:
    # Security settings of the producer apply to the admin client too, and the user's logger.
    return {
        k: v
        for k, v in settings.kafka.items()
        if k.startswith(("security.", "sasl.", "ssl.")) or k == "logger"
    }


def _existing_partitions(
    admin: AdminClient, names: TopicNames, timeout: float, bootstrap: str
) -> dict[str, int]:
    try:  # a dropped connection is tried again within the timeout (outbox.topic_metadata)
        metadata = read_topic_metadata(admin, timeout, what=bootstrap)
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
            config=_settings(names, t, settings),
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


def _wait_for_leaders(
    admin: AdminClient, topics: list[str], timeout: float, bootstrap: str
) -> None:
    """Return once every partition of ``topics`` has a leader, so the topics are usable."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            remaining = max(0.001, deadline - time.monotonic())
            metadata = read_topic_metadata(admin, remaining, what=bootstrap)
        except KafkaException as err:
            if time.monotonic() >= deadline:
                break  # timed out: the leaders' error below says what was waited for
            raise KafkaOperationError(
                f"topics {topics} were created, but listing them to see their leaders failed: "
                f"{err.args[0]}; is the broker reachable? Run ensure_topics again once it is",
                err.args[0],
            ) from err
        found = [metadata.topics.get(t) for t in topics]
        if all(
            t is not None and t.error is None and all(p.leader >= 0 for p in t.partitions.values())
            for t in found
        ):
            return
        time.sleep(0.1)
    raise KafkaOperationError(f"topics {topics} were created but have no leaders after {timeout} s")


def _settings(names: TopicNames, topic: str, settings: OutboxSettings) -> dict[str, str]:
    return topic_settings(
        names,
        topic,
        min_compaction_lag_ms=settings.min_compaction_lag_ms,
        half_retention_ms=settings.half_retention_ms,
        op_retention_ms=settings.op_retention_ms,
    )


def _describe(admin: AdminClient, topics: list[str], timeout: float) -> dict[str, dict[str, Any]]:
    """Each topic's configs as the broker has them (its defaults included), in one request."""
    if not topics:
        return {}
    resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics]
    try:
        return {
            resource.name: future.result(timeout)
            for resource, future in admin.describe_configs(
                resources, request_timeout=timeout
            ).items()
        }
    except KafkaException as err:
        raise KafkaOperationError(
            f"cannot read the configs of topics {topics}: {err.args[0]}", err.args[0]
        ) from err


def _problems(
    names: TopicNames,
    settings: OutboxSettings,
    topic: str,
    existing: dict[str, int],
    configs: dict[str, dict[str, Any]],
) -> list[str]:
    problems = []
    if topic in (names.half, names.op, names.state) and existing[topic] != settings.partitions:
        problems.append(
            f"{topic} has {existing[topic]} partitions, expected {settings.partitions} "
            "(the half, op and state topics must have equal partition counts)"
        )
    if topic == names.dead_letter and existing[topic] < settings.partitions:
        # each dead letter goes to its half record's partition number: one the topic lacks
        # fails every round of the checker that gives up there, and the relay's batch
        problems.append(
            f"{topic} has {existing[topic]} partitions, expected at least {settings.partitions} "
            "(a dead letter is written to its half record's partition)"
        )
    if topic == names.op:
        return problems  # its cleanup policy is checked with its retention (_op_problems)
    expected = _settings(names, topic, settings)
    for key in _CHECKED_CONFIGS:
        actual = _value(configs[topic], key)
        if actual != expected[key]:
            problems.append(f"{topic} has {key}={actual}, expected {expected[key]}")
    return problems


def _op_problems(
    names: TopicNames,
    settings: OutboxSettings,
    op: dict[str, Any],
    half: dict[str, Any],
) -> list[str]:
    """The op topic must be deleted by age, after its half records and the audit window.

    Its keys are unique transaction ids, so compaction alone never shrinks it; and a decision
    deleted before its half records leaves them undecided for the relay and checker to find
    again, and the audit without the decision it joins them with.
    """
    policy = _value(op, "cleanup.policy")
    retention = _int(_value(op, "retention.ms"))
    half_retention = _int(_value(half, "retention.ms"))
    lag = _int(_value(op, "min.compaction.lag.ms"))
    if lag is None:
        lag = settings.min_compaction_lag_ms
    found = []
    if _policies(policy) != _policies(OP_CLEANUP_POLICY):
        found.append(
            f"{names.op} has cleanup.policy={policy}, expected {OP_CLEANUP_POLICY} (its keys are "
            "unique transaction ids: compaction alone never shrinks it)"
        )
    if retention is None or half_retention is None:
        retention_problem: str | None = (
            f"the retention.ms of {names.op} or {names.half} could not be read"
        )
    else:
        retention_problem = op_retention_problem(
            retention, half_retention_ms=half_retention, min_compaction_lag_ms=lag
        )
    if retention_problem is not None:
        found.append(f"{names.op}: {retention_problem}")
    if not found:
        return []
    half_bound = settings.half_retention_ms if half_retention is None else half_retention
    retention_ms = required_op_retention_ms(settings.op_retention_ms, lag, half_bound)
    return [f"{'; '.join(found)}; fix: {_fix_command(settings, names.op, retention_ms)}"]


def _fix_command(settings: OutboxSettings, op_topic: str, retention_ms: int) -> str:
    """The operator's command that makes ``op_topic`` usable in place (docs: README, "Upgrading
    an existing deployment: op topic retention"); the brackets keep the policy one value."""
    return (
        f"kafka-configs.sh --bootstrap-server {settings.bootstrap_servers} --alter "
        f"--entity-type topics --entity-name {op_topic} --add-config "
        f"'cleanup.policy=[{OP_CLEANUP_POLICY}],retention.ms={retention_ms}'"
    )


def _value(config: dict[str, Any], key: str) -> str | None:
    entry = config.get(key)
    return None if entry is None or entry.value is None else str(entry.value)


def _int(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def _policies(value: str | None) -> set[str]:
    """``compact,delete`` and ``delete,compact`` (or ``[compact, delete]``) are one policy."""
    return {p.strip() for p in (value or "").strip("[]").split(",") if p.strip()}

"""Which topics exist, how many partitions they have and which offsets they still hold, asked
through Spark's own JVM.

The Java ``Admin`` client comes with the Kafka source's jars, so it takes exactly the Kafka
settings the source takes (``security.protocol``, SASL, ...); and an unreachable broker is
reported within ``timeout_s`` instead of after the source's retries.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]

from checker.audit.errors import AuditSourceError
from outbox.message import is_legal_topic

_T = TypeVar("_T")


def topic_partitions(
    spark: Any,
    bootstrap_servers: str,
    kafka: Mapping[str, Any],
    topics: Iterable[str],
    *,
    timeout_s: float,
) -> dict[str, int]:
    """Partition counts of those of ``topics`` that exist (missing ones are left out).

    Each topic is described by name, not looked up in the list of all topics: Kafka leaves the
    topics a principal may not describe out of that list, and a real topic taken for missing
    makes every COMMIT to it ``lost``. A topic the audit may not see is an error instead. A
    name Kafka does not allow (a producer not ours wrote it in a half record) is missing: no
    topic can hold its records.

    Raises:
        AuditSourceError: Kafka did not answer within ``timeout_s``, or refused (see
            :func:`failure_text`).
    """
    wanted = sorted(t for t in set(topics) if is_legal_topic(t))
    if not wanted:
        return {}

    def ask(admin: Any, wait: Callable[[Any], Any]) -> dict[str, int]:
        described = admin.describeTopics(wanted).topicNameValues()
        found: dict[str, int] = {}
        failed: dict[str, tuple[list[str], str]] = {}  # topic -> (its error's classes, text)
        for topic in wanted:
            try:
                found[topic] = int(wait(described.get(topic)).partitions().size())
            except Py4JJavaError as err:
                cause = _cause(err)
                classes = _class_names(cause)
                if not _simple(classes) & {
                    "UnknownTopicOrPartitionException",
                    "InvalidTopicException",
                }:
                    failed[topic] = (classes, str(cause.toString()))
        if failed:  # Kafka's refusal names no topic: these do, one sentence per cause
            by_cause: dict[str, list[str]] = {}
            for topic in sorted(failed):
                by_cause.setdefault(failed[topic][0][0], []).append(topic)
            raise AuditSourceError(
                " ".join(
                    failure_text(
                        *failed[named[0]],
                        bootstrap_servers=bootstrap_servers,
                        timeout_s=timeout_s,
                        operation="Describe",
                        topics=named,
                    )
                    for named in by_cause.values()
                )
            )
        return found

    return _with_admin(spark, bootstrap_servers, kafka, timeout_s, ask, "Describe", wanted)


def held_offsets(
    spark: Any,
    bootstrap_servers: str,
    kafka: Mapping[str, Any],
    partitions: Mapping[str, int],
    *,
    timeout_s: float,
) -> dict[str, dict[int, tuple[int, int]]]:
    """Per topic and partition, the (log start, log end) offsets: what it still holds.

    A log start above 0 means records were removed from its head (retention, or an
    operator's ``kafka-delete-records``).

    Raises:
        AuditSourceError: Kafka did not answer within ``timeout_s``, or refused (see
            :func:`failure_text`).
    """
    wanted = {t: n for t, n in partitions.items() if n > 0}
    if not wanted:
        return {}

    def ask(admin: Any, wait: Callable[[Any], Any]) -> dict[str, dict[int, tuple[int, int]]]:
        jvm = spark.sparkContext._jvm
        spec = jvm.org.apache.kafka.clients.admin.OffsetSpec
        found: dict[str, dict[int, dict[str, int]]] = {t: {} for t in wanted}
        for name, which in (("start", spec.earliest()), ("end", spec.latest())):
            request = jvm.java.util.HashMap()
            for topic, count in wanted.items():
                for p in range(count):
                    request.put(jvm.org.apache.kafka.common.TopicPartition(topic, p), which)
            answer = wait(admin.listOffsets(request).all())
            for tp in answer.keySet():
                offset = int(answer.get(tp).offset())
                found[str(tp.topic())].setdefault(int(tp.partition()), {})[name] = offset
        return {
            t: {p: (o["start"], o["end"]) for p, o in sorted(ps.items())} for t, ps in found.items()
        }

    return _with_admin(spark, bootstrap_servers, kafka, timeout_s, ask, "Describe", sorted(wanted))


def topic_configs(
    spark: Any,
    bootstrap_servers: str,
    kafka: Mapping[str, Any],
    topics: Iterable[str],
    names: Iterable[str],
    *,
    timeout_s: float,
) -> dict[str, dict[str, str]]:
    """The settings ``names`` (``cleanup.policy``, ``retention.ms``, ...) of each of ``topics``,
    as the brokers apply them (a topic's own value, else the broker's default).

    Raises:
        AuditSourceError: Kafka did not answer within ``timeout_s``, or refused (see
            :func:`failure_text`).
    """
    wanted, keys = sorted(set(topics)), sorted(set(names))
    if not wanted:
        return {}

    def ask(admin: Any, wait: Callable[[Any], Any]) -> dict[str, dict[str, str]]:
        jvm = spark.sparkContext._jvm
        resource = jvm.org.apache.kafka.common.config.ConfigResource
        kind = getattr(jvm.org.apache.kafka.common.config, "ConfigResource$Type").TOPIC
        asked = jvm.java.util.ArrayList()
        for topic in wanted:
            asked.add(resource(kind, topic))
        answer = wait(admin.describeConfigs(asked).all())
        found: dict[str, dict[str, str]] = {}
        for key in answer.keySet():
            config = answer.get(key)
            values = found.setdefault(str(key.name()), {})
            for name in keys:
                entry = config.get(name)
                if entry is not None and entry.value() is not None:
                    values[name] = str(entry.value())
        return found

    return _with_admin(spark, bootstrap_servers, kafka, timeout_s, ask, "DescribeConfigs", wanted)


def is_compacted(config: Mapping[str, str]) -> bool:
    """Whether a topic's ``cleanup.policy`` includes ``compact`` (the cleaner keeps only each
    key's latest record)."""
    policy = config.get("cleanup.policy", "")
    return "compact" in {p.strip() for p in policy.split(",")}


def _with_admin(
    spark: Any,
    bootstrap_servers: str,
    kafka: Mapping[str, Any],
    timeout_s: float,
    ask: Callable[[Any, Callable[[Any], Any]], _T],
    operation: str,
    topics: Sequence[str],
) -> _T:
    """``ask(admin, wait)`` with a Java Admin client (closed after), ``wait`` taking a
    KafkaFuture's value by one deadline ``timeout_s`` away, however many it waits for; failures
    as :class:`AuditSourceError` worded by :func:`failure_text` (``operation``: the ACL
    operation the request needs on ``topics``)."""
    jvm = spark.sparkContext._jvm
    timeout_ms = str(int(timeout_s * 1000))
    props = jvm.java.util.Properties()
    settings = {**kafka, "bootstrap.servers": bootstrap_servers}
    settings.setdefault("default.api.timeout.ms", timeout_ms)
    settings.setdefault("request.timeout.ms", timeout_ms)
    for key, value in settings.items():
        props.setProperty(str(key), str(value))
    millis = jvm.java.util.concurrent.TimeUnit.MILLISECONDS
    deadline = time.monotonic() + max(1.0, timeout_s)

    def wait(future: Any) -> Any:
        return future.get(max(1, int((deadline - time.monotonic()) * 1000)), millis)

    admin = jvm.org.apache.kafka.clients.admin.Admin.create(props)
    try:
        return ask(admin, wait)
    except Py4JJavaError as err:
        cause = _cause(err)
        raise AuditSourceError(
            failure_text(
                _class_names(cause),
                str(cause.toString()),
                bootstrap_servers=bootstrap_servers,
                timeout_s=timeout_s,
                operation=operation,
                topics=topics,
            )
        ) from err
    finally:
        admin.close(jvm.java.time.Duration.ofSeconds(5))


def failure_text(
    classes: Sequence[str],
    cause: str,
    *,
    bootstrap_servers: str,
    timeout_s: float,
    operation: str,
    topics: Sequence[str] = (),
) -> str:
    """What to tell the operator about an Admin request that failed with ``cause``, an
    exception whose class and superclasses are ``classes`` (fully qualified names): a timeout
    is a network or address problem, a refused permission or login is not, and saying "did not
    answer" of those sends the operator to the wrong place. ``operation`` is the ACL operation
    the request needs, on ``topics`` (all those it asked about when none are named)."""
    simple = _simple(classes)
    on = ", ".join(topics) if topics else "the topics"
    if "TopicAuthorizationException" in simple:
        also = " and Read" if operation == "Describe" else ""  # the audit reads what it describes
        return (
            f"Kafka at {bootstrap_servers} refused the audit's request on {on} ({cause}); grant "
            f"the audit's principal {operation}{also} on {on}, or run it as one that has it"
        )
    if "AuthorizationException" in simple:
        return (
            f"Kafka at {bootstrap_servers} refused the audit's request ({cause}); grant the "
            "audit's principal the permission Kafka names, or run it as one that has it"
        )
    if "AuthenticationException" in simple:
        return (
            f"Kafka at {bootstrap_servers} did not accept the audit's login ({cause}); check "
            "its security settings (security.protocol, sasl.*, ssl.*) in --command-config, "
            "--kafka-option or OUTBOX_AUDIT_KAFKA__*"
        )
    if "TimeoutException" in simple:
        return (
            f"Kafka at {bootstrap_servers} did not answer within {timeout_s:.0f} s ({cause}); "
            "check --bootstrap-servers and the network"
        )
    return (
        f"Kafka at {bootstrap_servers} answered the audit's request on {on} with an error: {cause}"
    )


def _class_names(exception: Any) -> list[str]:
    """The Java class of ``exception`` and its superclasses, fully qualified."""
    names: list[str] = []
    kind = exception.getClass()
    while kind is not None:
        names.append(str(kind.getName()))
        kind = kind.getSuperclass()
    return names


def _cause(err: Any) -> Any:
    """The Java exception behind a Py4J error (a KafkaFuture's ExecutionException unwrapped)."""
    return err.java_exception.getCause() or err.java_exception


def _simple(classes: Sequence[str]) -> set[str]:
    """The classes' names without their packages: Kafka's errors are matched by name, as the
    Java classes are not importable here."""
    return {c.rsplit(".", 1)[-1] for c in classes}

"""Which topics exist, how many partitions they have and which offsets they still hold, asked
through Spark's own JVM.

The Java ``Admin`` client comes with the Kafka source's jars, so it takes exactly the Kafka
settings the source takes (``security.protocol``, SASL, ...); and an unreachable broker is
reported within ``timeout_s`` instead of after the source's retries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from checker.audit.errors import AuditSourceError

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

    Raises:
        AuditSourceError: Kafka did not answer within ``timeout_s``.
    """

    def ask(admin: Any, wait: Callable[[Any], Any]) -> dict[str, int]:
        names = set(wait(admin.listTopics().names()))
        wanted = sorted(set(topics) & names)
        if not wanted:
            return {}
        described = wait(admin.describeTopics(wanted).allTopicNames())
        return {t: int(described.get(t).partitions().size()) for t in wanted}

    return _with_admin(spark, bootstrap_servers, kafka, timeout_s, ask)


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
        AuditSourceError: Kafka did not answer within ``timeout_s``.
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

    return _with_admin(spark, bootstrap_servers, kafka, timeout_s, ask)


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
        AuditSourceError: Kafka did not answer within ``timeout_s``.
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

    return _with_admin(spark, bootstrap_servers, kafka, timeout_s, ask)


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
) -> _T:
    """``ask(admin, wait)`` with a Java Admin client (closed after), ``wait`` taking a
    KafkaFuture's value within the timeout; failures as :class:`AuditSourceError`."""
    from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]

    jvm = spark.sparkContext._jvm
    timeout_ms = str(int(timeout_s * 1000))
    props = jvm.java.util.Properties()
    settings = {**kafka, "bootstrap.servers": bootstrap_servers}
    settings.setdefault("default.api.timeout.ms", timeout_ms)
    settings.setdefault("request.timeout.ms", timeout_ms)
    for key, value in settings.items():
        props.setProperty(str(key), str(value))
    seconds = jvm.java.util.concurrent.TimeUnit.SECONDS
    limit = max(1, int(timeout_s))
    admin = jvm.org.apache.kafka.clients.admin.Admin.create(props)
    try:
        return ask(admin, lambda future: future.get(limit, seconds))
    except Py4JJavaError as err:
        cause = err.java_exception.getCause() or err.java_exception
        raise AuditSourceError(
            f"Kafka at {bootstrap_servers} did not answer within {timeout_s:.0f} s "
            f"({cause.toString()}); check --bootstrap-servers and the network"
        ) from err
    finally:
        admin.close(jvm.java.time.Duration.ofSeconds(5))

"""Which topics exist and how many partitions they have, asked through Spark's own JVM.

The Java ``Admin`` client comes with the Kafka source's jars, so it takes exactly the Kafka
settings the source takes (``security.protocol``, SASL, ...); and an unreachable broker is
reported within ``timeout_s`` instead of after the source's retries.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from checker.audit.errors import AuditSourceError


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
    wait = max(1, int(timeout_s))
    admin = jvm.org.apache.kafka.clients.admin.Admin.create(props)
    try:
        names = set(admin.listTopics().names().get(wait, seconds))
        wanted = sorted(set(topics) & names)
        if not wanted:
            return {}
        described = admin.describeTopics(wanted).allTopicNames().get(wait, seconds)
        return {t: int(described.get(t).partitions().size()) for t in wanted}
    except Py4JJavaError as err:
        cause = err.java_exception.getCause() or err.java_exception
        raise AuditSourceError(
            f"Kafka at {bootstrap_servers} did not answer within {timeout_s:.0f} s "
            f"({cause.toString()}); check --bootstrap-servers and the network"
        ) from err
    finally:
        admin.close(jvm.java.time.Duration.ofSeconds(5))

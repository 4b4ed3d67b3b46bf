"""Shared fixtures. The real-service fixtures come from the ``outbox.testing`` pytest plugin."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from outbox.kafka_logging import flush_held
from outbox.testing import HarnessSettings
from tests import logged_clients

if TYPE_CHECKING:
    from tests.acl_kafka import AclKafka

logged_clients.install()  # before any test module imports confluent_kafka's clients


@pytest.fixture(autouse=True)
def _librdkafka_counts_in_their_test(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """The counts of librdkafka lines a test's clients repeated are logged as it ends, with its
    log: a minute later the timer would log them into another test's (and at the run's end,
    raw on stderr after the summary). Asks for ``caplog`` so as to run before it restores the
    levels a test set."""
    yield
    flush_held()


def pytest_sessionfinish() -> None:
    """What session-scoped clients repeated, while the broker fixtures stopped, before the
    summary rather than raw after it."""
    flush_held()


@pytest.fixture(scope="session")
def spark(harness_settings: HarnessSettings) -> Iterator[object]:
    """A local[2] SparkSession with the Kafka source and the PostgreSQL driver on its classpath."""
    try:
        from pyspark.sql import SparkSession
    except ImportError as err:  # pragma: no cover - dev installs always have it
        pytest.fail(f"pyspark is not installed ({err}); run `make setup`", pytrace=False)
    jars = sorted(Path(harness_settings.spark_jars_dir).glob("*.jar"))
    if not any(j.name.startswith("spark-sql-kafka") for j in jars):
        message = f"no spark-sql-kafka jar in {harness_settings.spark_jars_dir}; run `make jars`"
        if harness_settings.ci:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    from checker.audit.session import local_defaults

    os.environ.setdefault("PYSPARK_PYTHON", os.sys.executable)  # type: ignore[attr-defined]
    # The audit's own plan choices (aggregation, cache), so tests judge what operators run.
    planned = {k: v for k, v in local_defaults().items() if k.startswith("spark.sql.execution.")}
    planned["spark.sql.inMemoryColumnarStorage.compressed"] = "false"
    builder = SparkSession.builder
    for key, value in planned.items():
        builder = builder.config(key, value)
    session = (
        builder.master("local[2]")
        .appName("outbox-tests")
        .config("spark.jars", ",".join(str(j) for j in jars))
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def acl_broker(
    harness_settings: HarnessSettings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AclKafka]:
    """A broker of its own that enforces ACLs (tests/acl_kafka.py), for the tests that run a
    service as a principal a cluster's ACLs limit; started by the first test that asks."""
    from tests.acl_kafka import acl_kafka

    with acl_kafka(harness_settings, tmp_path_factory.mktemp("acl-broker")) as broker:
        yield broker


# Fixtures shared by the producer, relay and checker tests.
from tests.clock_fixtures import skewed_clock  # noqa: E402, F401
from tests.producer_fixtures import (  # noqa: E402, F401
    doomed_kafka,
    engine,
    outbox_settings,
    producer,
    session_factory,
    topics,
)
from tests.tracing_fixtures import traces  # noqa: E402, F401

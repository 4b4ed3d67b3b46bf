"""pytest fixtures that hand tests real services, started once per session.

Opt-in (installing ``kafka-outbox[testing]`` loads nothing into anyone's test run): ``pytest -p
outbox.testing.pytest_plugin``, or ``addopts = "-p outbox.testing.pytest_plugin"`` in the pytest
settings, or ``pytest_plugins = ["outbox.testing.pytest_plugin"]`` in the root ``conftest.py``.

Fixtures: ``kafka_bootstrap``, ``postgres_url``, ``sqlite_url``, ``db_url`` (parametrised over
PostgreSQL and SQLite), ``schema_registry_url`` (a Confluent-compatible schema registry's URL for
``SchemaRegistryClient``), the ``kafka_service`` / ``postgres_service`` /
``schema_registry_service`` handles, ``kafka_cluster`` (three brokers, replication factor 3 and
``min.insync.replicas=2``, once on the pinned Kafka release and once on the newest), and
``local_kafka`` / ``local_postgres`` / ``container_kafka`` / ``container_postgres`` pinned to one
provider. ``OUTBOX_TEST_EVENT_LOOP=uvloop`` runs the session's asyncio code on uvloop
(:mod:`outbox.testing.event_loop`). Under ``CI=true`` a service that cannot start FAILS the
test; elsewhere it skips with the reason (never a silent pass).
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest

from outbox.testing.event_loop import use_event_loop
from outbox.testing.kafka_cluster import KafkaCluster
from outbox.testing.providers import Provider, start_kafka, start_postgres, start_schema_registry
from outbox.testing.service import RunningService, ServiceStartError
from outbox.testing.settings import HarnessSettings, event_loop_from_env

_started: list[RunningService] = []


def _start(
    request: pytest.FixtureRequest,
    starter: Callable[..., RunningService],
    provider: Provider | None = None,
) -> RunningService:
    settings: HarnessSettings = request.getfixturevalue("harness_settings")
    try:
        service = starter(settings, provider=provider)
    except ServiceStartError as err:
        message = f"could not start a test service: {err}"
        if settings.ci:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    _started.append(service)
    return service


@pytest.fixture(scope="session")
def harness_settings() -> HarnessSettings:
    return HarnessSettings.from_env()


@pytest.fixture(scope="session")
def kafka_service(request: pytest.FixtureRequest) -> Iterator[RunningService]:
    service = _start(request, start_kafka)
    yield service
    service.stop()


@pytest.fixture(scope="session")
def postgres_service(request: pytest.FixtureRequest) -> Iterator[RunningService]:
    service = _start(request, start_postgres)
    yield service
    service.stop()


@pytest.fixture(scope="session")
def schema_registry_service(request: pytest.FixtureRequest) -> Iterator[RunningService]:
    service = _start(request, start_schema_registry)
    yield service
    service.stop()


@pytest.fixture(scope="session", params=["pinned", "newest"])
def kafka_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KafkaCluster]:
    """A three-broker KRaft cluster of local processes, once per Kafka release: the pinned one
    (jvm/kafka) and the newest (jvm/kafka-newest). Tests may kill, stop and restart its nodes;
    they leave all three running. Only local processes: no container provider yet."""
    settings: HarnessSettings = request.getfixturevalue("harness_settings")
    jars = settings.kafka_jars_dir if request.param == "pinned" else settings.kafka_newest_jars_dir
    try:
        cluster = KafkaCluster(
            settings, jars_dir=jars, workdir=tmp_path_factory.mktemp("kafka-cluster")
        )
        cluster.start()
    except ServiceStartError as err:
        message = f"could not start a three-broker Kafka cluster: {err}"
        if settings.ci:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    yield cluster
    cluster.close()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_service: RunningService) -> str:
    return kafka_service.address


@pytest.fixture(scope="session")
def postgres_url(postgres_service: RunningService) -> str:
    return postgres_service.address


@pytest.fixture(scope="session")
def schema_registry_url(schema_registry_service: RunningService) -> str:
    """The registry's Confluent-compatible API, e.g. ``http://127.0.0.1:PORT/apis/ccompat/v7``."""
    return schema_registry_service.address


@pytest.fixture(scope="session")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    path: Path = tmp_path_factory.mktemp("sqlite") / "outbox.db"
    return f"sqlite:///{path}"


@pytest.fixture(scope="session", params=["postgresql", "sqlite"])
def db_url(request: pytest.FixtureRequest) -> str:
    """Each test using it runs once on PostgreSQL and once on SQLite."""
    name = "postgres_url" if request.param == "postgresql" else "sqlite_url"
    url: str = request.getfixturevalue(name)
    return url


def _pinned(
    request: pytest.FixtureRequest,
    session_fixture: str,
    starter: Callable[..., RunningService],
    provider: Provider,
) -> Iterator[RunningService]:
    """The session's service when it already runs on ``provider``, else a private one."""
    settings: HarnessSettings = request.getfixturevalue("harness_settings")
    if settings.provider in (provider, "auto"):
        shared: RunningService = request.getfixturevalue(session_fixture)
        if shared.provider == provider:
            yield shared
            return
    service = _start(request, starter, provider)
    yield service
    service.stop()


@pytest.fixture(scope="session")
def local_kafka(request: pytest.FixtureRequest) -> Iterator[RunningService]:
    yield from _pinned(request, "kafka_service", start_kafka, "local")


@pytest.fixture(scope="session")
def local_postgres(request: pytest.FixtureRequest) -> Iterator[RunningService]:
    yield from _pinned(request, "postgres_service", start_postgres, "local")


@pytest.fixture(scope="session")
def container_kafka(request: pytest.FixtureRequest) -> Iterator[RunningService]:
    yield from _pinned(request, "kafka_service", start_kafka, "containers")


@pytest.fixture(scope="session")
def container_postgres(request: pytest.FixtureRequest) -> Iterator[RunningService]:
    yield from _pinned(request, "postgres_service", start_postgres, "containers")


def pytest_configure(config: pytest.Config) -> None:
    """A SIGTERM (``timeout``, a CI runner cancelling the job) ends the session like Ctrl-C
    does, so the services and processes it started are stopped (their ``atexit`` handlers and
    fixture teardowns run) instead of being left running to slow down the next run. And the
    session's event loop is the one ``OUTBOX_TEST_EVENT_LOOP`` names (asyncio's by default)."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupted)
    try:
        use_event_loop(event_loop_from_env())
    except ServiceStartError as err:
        raise pytest.UsageError(str(err)) from err


def _interrupted(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends it at once
    raise KeyboardInterrupt("SIGTERM: stopping the services this session started")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach the tail of every running service's log to a failed test's report."""
    report = yield
    if report.failed and call.when == "call":
        for service in _started:
            if not service.stopped:
                tail = "\n".join(service.logs().splitlines()[-40:])
                report.sections.append((f"{service.name} log ({service.provider})", tail))
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Which provider started what: the session's record of the services it really used."""
    if _started:
        terminalreporter.section("outbox.testing services")
        for service in _started:
            terminalreporter.write_line(service.describe())

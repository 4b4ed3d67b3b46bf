"""The service image on a container engine: built from deploy/Containerfile with no registry,
its relay and checker containers promote a committed transaction and answer their probes."""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import sessionmaker

from outbox import OutboxProducer, OutboxSettings, ensure_topics, migrations
from outbox.protocol import Header
from outbox.testing import HarnessSettings
from outbox.testing.engine import Engine, find_engine
from outbox.testing.ports import free_port
from outbox.testing.service import ServiceStartError
from outbox.testing.service_image import BuiltImage, build_service_image
from tests.deploy.conftest import REPORT
from tests.kafka_helpers import create_topic, unique
from tests.outbox_cli.records import read_messages

pytestmark = [pytest.mark.integration, pytest.mark.processes]
CHECKOUT = Path(__file__).resolve().parents[2]
SECRET = "image-test-secret"


@pytest.fixture(scope="module")
def container_engine(harness_settings: HarnessSettings) -> Engine:
    found = None
    try:  # whatever provider runs the broker: this test needs an engine of its own
        found = find_engine(harness_settings)
    except ServiceStartError as err:
        reason = str(err)
    else:
        reason = "no container engine (Docker, or Podman: `make system`)"
    if found is None:
        if harness_settings.ci:
            pytest.fail(f"the image test needs a container engine: {reason}", pytrace=False)
        pytest.skip(reason)
    return found


@pytest.fixture(scope="module")
def image(harness_settings: HarnessSettings, container_engine: Engine) -> BuiltImage:
    try:
        built = build_service_image(harness_settings, container_engine, CHECKOUT)
    except ServiceStartError as err:
        pytest.fail(str(err), pytrace=False)
    state = "cached" if built.cached else f"built in {built.seconds:.1f} s"
    REPORT.append(
        f"built image {built.name} from deploy/Containerfile ({state}, base {built.base})"
    )
    return built


class Containers:
    """``podman run`` (or docker) on the host network, so they reach the test broker as-is."""

    def __init__(self, cli: str, image: str) -> None:
        self.cli, self.image, self.names = cli, image, []

    def run(self, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        flags = [f"--env={k}={v}" for k, v in env.items()]
        return subprocess.run(
            [self.cli, "run", "--rm", "--network=host", *flags, self.image, *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def start(self, name: str, command: str, env: dict[str, str]) -> str:
        flags = [f"--env={k}={v}" for k, v in env.items()]
        subprocess.run([self.cli, "rm", "-f", name], capture_output=True, check=False)
        subprocess.run(
            [self.cli, "run", "-d", "--name", name, "--network=host", *flags, self.image, command],
            capture_output=True,
            text=True,
            check=True,
        )
        self.names.append(name)
        return name

    def logs(self, name: str) -> str:
        done = subprocess.run([self.cli, "logs", name], capture_output=True, text=True, check=False)
        return (done.stdout + done.stderr)[-4000:]

    def stop(self, name: str) -> int:
        """SIGTERM, then the container's exit code."""
        subprocess.run([self.cli, "stop", "-t", "20", name], capture_output=True, check=False)
        code = subprocess.run(
            [self.cli, "inspect", "--format", "{{.State.ExitCode}}", name],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        return int(code or -1)

    def remove_all(self) -> None:
        for name in self.names:
            subprocess.run([self.cli, "rm", "-f", name], capture_output=True, check=False)


@pytest.fixture
def containers(container_engine: Engine, image: BuiltImage) -> Iterator[Containers]:
    kind = container_engine.kind
    running = Containers("podman" if kind == "podman" else "docker", image.name)
    yield running
    running.remove_all()


def wait_for(
    predicate: Callable[[], bool], timeout: float, what: str, logs: Callable[[], str]
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}; logs:\n{logs()}"
        time.sleep(0.5)


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0


def test_relay_and_checker_containers_promote_a_committed_transaction_and_are_ready(
    containers: Containers, kafka_bootstrap: str, sqlite_url: str
) -> None:
    started = time.monotonic()
    prefix, topic = unique("__outbox-image"), unique("orders-image")
    relay_port, checker_port = free_port(), free_port()
    shared = {
        "OUTBOX_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "OUTBOX_TOPIC_PREFIX": prefix,
        "OUTBOX_PARTITIONS": "3",
    }
    # Given the internal topics, created by the image's one-shot command
    ensured = containers.run("topics", "ensure", env=shared)
    assert ensured.returncode == 0, ensured.stdout + ensured.stderr
    assert f"{prefix}-half: created" in ensured.stdout
    create_topic(kafka_bootstrap, topic)
    # And a relay and a checker container, configured only by environment variables
    relay = containers.start(
        unique("outbox-relay"),
        "relay",
        {
            **shared,
            "OUTBOX_RELAY_TOPIC_PREFIX": prefix,
            "OUTBOX_RELAY_GROUP_ID": unique("relay"),
            "OUTBOX_RELAY_HTTP_PORT": str(relay_port),
        },
    )
    checker = containers.start(
        unique("outbox-checker"),
        "checker",
        {
            **shared,
            "OUTBOX_CHECKER_TOPIC_PREFIX": prefix,
            "OUTBOX_CHECKER_GROUP_ID": unique("checker"),
            "OUTBOX_CHECK_SECRET": SECRET,
            "OUTBOX_CHECKER_HTTP_PORT": str(checker_port),
        },
    )

    # When the library on the host commits a transaction
    settings = OutboxSettings(
        bootstrap_servers=kafka_bootstrap,
        producer_group="orders",
        topic_prefix=prefix,
        partitions=3,
    )
    ensure_topics(settings)
    migrations.upgrade(sqlite_url)
    database = sa.create_engine(sqlite_url)
    with OutboxProducer(settings) as producer, producer.transaction(sessionmaker(database)) as txn:
        txn.send(topic, b'{"order": 1}', key=b"customer-1")
    txn_id = txn.txn_id

    # Then the relay container promotes it: a read_committed consumer sees it on its topic
    def promoted() -> list:
        return [
            m
            for m in read_messages(kafka_bootstrap, topic)
            if dict(m.headers() or []).get(Header.TXN_ID.value) == txn_id.encode()
        ]

    wait_for(lambda: len(promoted()) == 1, 90, "the promotion", lambda: containers.logs(relay))
    [record] = promoted()
    REPORT.append(
        f"relay container promoted transaction {txn_id} to {topic}[{record.partition()}]"
        f"@{record.offset()} ({time.monotonic() - started:.1f} s after start)"
    )
    # And both containers answer /readyz and /healthz, and their image's HEALTHCHECK passes
    for name, port in ((relay, relay_port), (checker, checker_port)):
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda u=url: status_of(f"{u}/readyz") == 200, 60, f"{name} /readyz",
                 lambda n=name: containers.logs(n))  # fmt: skip
        assert status_of(f"{url}/healthz") == 200
        health = subprocess.run(
            [containers.cli, "healthcheck", "run", name], capture_output=True, text=True
        )
        if containers.cli == "podman":
            assert health.returncode == 0, health.stdout + health.stderr
        REPORT.append(f"{name}: GET /readyz -> 200, GET /healthz -> 200, HEALTHCHECK ok")
    # And the operator commands in the image see the same story
    story = containers.run("inspect", txn_id, env=shared)
    assert story.returncode == 0, story.stderr
    assert "COMMIT" in story.stdout and topic in story.stdout
    # And SIGTERM stops both cleanly
    assert containers.stop(relay) == 0, containers.logs(relay)
    assert containers.stop(checker) == 0, containers.logs(checker)

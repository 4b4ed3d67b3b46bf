"""Both providers stay alive: one class of round trips pinned to each."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from confluent_kafka import Consumer, Producer, TopicPartition

from outbox.testing import RunningService
from outbox.testing.containers import remove_left_containers
from outbox.testing.left_processes import remove_left_processes
from outbox.testing.owners import OWNER_LABEL

pytestmark = pytest.mark.integration


def _kafka_round_trip(bootstrap: str) -> bytes | None:
    topic = f"provider-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, b"hello")
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        msg = consumer.poll(15)
        return None if msg is None else msg.value()
    finally:
        consumer.close()


def _server_version(url: str) -> str:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return str(conn.execute(sa.text("SHOW server_version")).scalar_one())
    finally:
        engine.dispose()


@pytest.mark.provider_local
class TestLocalProcessProvider:
    def test_kafka_runs_as_a_local_process_and_round_trips(self, local_kafka: RunningService):
        assert local_kafka.provider == "local"
        assert _kafka_round_trip(local_kafka.address) == b"hello"

    def test_postgres_runs_as_a_local_process_and_answers(self, local_postgres: RunningService):
        assert local_postgres.provider == "local"
        assert _server_version(local_postgres.address)[:2].isdigit()

    @pytest.mark.parametrize("service", ["kafka", "postgres"])
    def test_a_killed_sessions_local_service_is_stopped_and_this_ones_stay(
        self, service: str, local_kafka: RunningService, local_postgres: RunningService
    ) -> None:
        """A session killed with -9 leaves its local broker or PostgreSQL (``pg_ctl`` detached
        it) running; the next session's start stops it and removes its folder, and leaves
        this session's services, which still run."""
        started = subprocess.Popen(
            [sys.executable, "-c", KILLED_LOCAL_SESSION.format(service=service)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert started.stdout is not None
            ready, _, _ = select.select([started.stdout], [], [], 180)
            said = started.stdout.readline().split() if ready else []
            assert len(said) == 2, f"the killed session's {service} did not start within 180 s"
            port, folder = int(said[0]), Path(said[1])
            os.kill(started.pid, signal.SIGKILL)
            started.wait(30)
            assert _answers(port), "a session killed with -9 leaves its service running"
            assert folder.is_dir()

            remove_left_processes()

            assert not _answers(port)
            assert not folder.exists()
        finally:
            if started.poll() is None:
                started.kill()
                started.wait(30)
            remove_left_processes()  # whatever failed above, the killed session's service goes
        assert _kafka_round_trip(local_kafka.address) == b"hello"
        assert _server_version(local_postgres.address)[:2].isdigit()


#: A session that starts a local service, says where (its port and folder) and waits to be killed.
KILLED_LOCAL_SESSION = """
import tempfile, time
from pathlib import Path
from outbox.testing import start_{service}
from outbox.testing.left_processes import OWNER_FILE
from outbox.testing.owners import this_process
service = start_{service}(provider="local")
port = service.address.rsplit(":", 1)[1].split("/")[0]
mine = [p for p in Path(tempfile.gettempdir()).glob("outbox-*")
        if (p / OWNER_FILE).is_file() and (p / OWNER_FILE).read_text() == this_process()]
print(port, *mine, flush=True)
time.sleep(600)
"""


def _answers(port: int) -> bool:
    """Whether something listens on this loopback port."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return False
    return True


@pytest.mark.provider_containers
class TestContainersProvider:
    def test_kafka_runs_in_a_container_and_round_trips(self, container_kafka: RunningService):
        assert container_kafka.provider == "containers"
        assert _kafka_round_trip(container_kafka.address) == b"hello"

    def test_postgres_runs_in_a_container_and_answers(self, container_postgres: RunningService):
        assert container_postgres.provider == "containers"
        assert _server_version(container_postgres.address)[:2].isdigit()

    def test_a_killed_sessions_running_container_is_removed_and_this_ones_stay(
        self, container_postgres: RunningService
    ) -> None:
        """A session killed with -9 leaves its PostgreSQL running; the next session's start
        removes it (owner gone), and leaves the containers of this session, which still runs."""
        import docker

        env = {**os.environ, "TESTCONTAINERS_RYUK_DISABLED": "true"}  # as on Podman: no reaper
        client = docker.from_env()  # the harness's DOCKER_HOST: the engine the child uses too
        started = subprocess.Popen(
            [sys.executable, "-c", KILLED_SESSION], stdout=subprocess.PIPE, text=True, env=env
        )
        owner = ""
        try:
            assert started.stdout is not None
            ready, _, _ = select.select([started.stdout], [], [], 180)
            owner = started.stdout.readline().strip() if ready else ""  # once its PG answers
            assert owner, (
                f"the killed session's container did not start within 180 s "
                f"(its process: {'running' if started.poll() is None else started.returncode})"
            )
            left = {"label": f"{OWNER_LABEL}={owner}"}
            os.kill(started.pid, signal.SIGKILL)
            started.wait(30)
            running = client.containers.list(filters=left)
            assert len(running) == 1, "a session killed with -9 leaves its container running"
            remove_left_containers()
            assert client.containers.list(all=True, filters=left) == []
        finally:
            if started.poll() is None:
                started.kill()
                started.wait(30)
            if owner:
                for container in client.containers.list(
                    all=True, filters={"label": f"{OWNER_LABEL}={owner}"}
                ):
                    container.remove(force=True)
            client.close()
        assert _server_version(container_postgres.address)[:2].isdigit()


#: A session that starts PostgreSQL in a container, says so (its owner label) and waits to be
#: killed.
KILLED_SESSION = """
import time
from outbox.testing import start_postgres
from outbox.testing.owners import this_process
start_postgres(provider="containers")
print(this_process(), flush=True)
time.sleep(600)
"""

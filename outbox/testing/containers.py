"""Starting Kafka and PostgreSQL as containers through testcontainers (Docker or Podman)."""

from __future__ import annotations

import base64
import contextlib
import uuid
from collections.abc import Callable
from typing import Any

from outbox.testing.engine import Engine
from outbox.testing.images import kafka_image, postgres_image
from outbox.testing.owners import OWNER_LABEL, gone, this_process
from outbox.testing.ports import free_port
from outbox.testing.readiness import wait_for_kafka, wait_for_postgres
from outbox.testing.service import RunningService, ServiceStartError
from outbox.testing.settings import HarnessSettings

LABEL = "outbox.testing"


def start_kafka_container(settings: HarnessSettings, engine: Engine) -> RunningService:
    """A single-node KRaft broker in a container, reachable on a free localhost port.

    The broker listens inside the container on the same port number it is mapped to, so the
    advertised ``localhost:PORT`` works from the host and from inside alike.
    """
    port = free_port()
    # An id starting with "-" is taken for an option by the storage tool (1 in 64 of these);
    # Kafka's own random ids never start with one either.
    cluster_id = "-"
    while cluster_id.startswith("-"):
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode()[:22]
    env = {
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": f"PLAINTEXT://:{port},CONTROLLER://:9093",
        "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://localhost:{port}",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
        "KAFKA_INTER_BROKER_LISTENER_NAME": "PLAINTEXT",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS": "4",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_NUM_PARTITIONS": "4",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
        "KAFKA_NUM_PARTITIONS": "1",
        "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "true",
        "KAFKA_LOG_DIRS": "/tmp/kraft-logs",
        "KAFKA_HEAP_OPTS": "-Xmx768m",
        "CLUSTER_ID": cluster_id,
    }
    image = kafka_image(settings, engine)
    address = f"localhost:{port}"
    container = _start(image, {port: port}, env)

    def ready() -> None:
        wait_for_kafka(address, timeout=120, alive=lambda: _running(container))

    _wait(container, ready, "kafka")
    return RunningService(
        name="kafka",
        provider="containers",
        address=address,
        _stop=container.stop,
        _logs=lambda: _logs(container),
        _restart=lambda: _restart(container, ready),
        engine=engine.kind,
    )


def start_postgres_container(settings: HarnessSettings, engine: Engine) -> RunningService:
    """PostgreSQL in a container with trust auth, on a free localhost port."""
    port = free_port()
    env = {
        "POSTGRES_HOST_AUTH_METHOD": "trust",
        "POSTGRES_USER": "postgres",
        "POSTGRES_DB": "postgres",
    }
    image = postgres_image(settings, engine)
    user = "postgres" if image.startswith("localhost/") else None
    args = ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "max_connections=200"]
    args += ["-c", "wal_level=logical"]  # for Debezium (postgres_process.SERVER_OPTIONS)
    container = _start(image, {5432: port}, env, command=args, user=user)
    url = f"postgresql+psycopg://postgres@localhost:{port}/postgres"

    def ready() -> None:
        wait_for_postgres(url, timeout=60, alive=lambda: _running(container))

    _wait(container, ready, "postgresql")
    return RunningService(
        name="postgresql",
        provider="containers",
        address=url,
        _stop=container.stop,
        _logs=lambda: _logs(container),
        _restart=lambda: _restart(container, ready),
        engine=engine.kind,
    )


def _start(
    image: str,
    ports: dict[int, int],
    env: dict[str, str],
    *,
    command: list[str] | None = None,
    user: str | None = None,
) -> Any:
    from testcontainers.core.container import DockerContainer

    remove_left_containers()
    container = DockerContainer(image)
    for inside, outside in ports.items():
        container.with_bind_ports(inside, outside)
    for key, value in env.items():
        container.with_env(key, value)
    if command:
        container.with_command(command)
    kwargs: dict[str, Any] = {"labels": {LABEL: "1", OWNER_LABEL: this_process()}}
    if user:
        kwargs["user"] = user
    container.with_kwargs(**kwargs)
    try:
        container.start()
    except Exception as err:
        raise ServiceStartError(f"cannot start a container from {image}: {err}") from err
    return container


def _wait(container: Any, ready: Callable[[], None], name: str) -> None:
    try:
        ready()
    except ServiceStartError as err:
        logs = _logs(container)
        container.stop()
        tail = "\n".join(logs.splitlines()[-60:])
        raise ServiceStartError(
            f"{name} container not ready: {err}\n--- its log ---\n{tail}"
        ) from err


def _running(container: Any) -> bool:
    wrapped = container.get_wrapped_container()
    wrapped.reload()
    return bool(wrapped.status == "running")


def _logs(container: Any) -> str:
    try:
        out, err = container.get_logs()
    except Exception as exc:  # the container may be gone already
        return f"(no logs: {exc})"
    return (out or b"").decode(errors="replace") + (err or b"").decode(errors="replace")


def _restart(container: Any, ready: Callable[[], None]) -> None:
    wrapped = container.get_wrapped_container()
    wrapped.stop(timeout=30)
    wrapped.start()
    ready()


def remove_left_containers() -> None:
    """Remove the containers left by sessions that were killed (no Ryuk on Podman to reap them):
    those whose owner has ended, running or not (:func:`stale`, :mod:`outbox.testing.owners`),
    and exited ones with no owner label. Run before each container starts; one removed
    meanwhile by someone else (Ryuk, another session) is skipped."""
    import docker
    from docker.errors import APIError

    client = docker.from_env()
    try:
        # ignore_removed: one stopped (and so removed) by its session while listed is skipped
        listed = client.containers.list(
            all=True, filters={"label": f"{LABEL}=1"}, ignore_removed=True
        )
        for old in listed:
            if stale(old.status, old.labels):
                with contextlib.suppress(APIError):  # NotFound too: gone already
                    old.remove(force=True)
    finally:
        client.close()


def stale(status: str, labels: dict[str, str]) -> bool:
    """Whether a container of this harness, in ``status`` with ``labels``, was left behind: its
    owner has ended, whatever its status (a running session's container is ``exited`` while it
    restarts, ``created`` while it starts). One with no owner label (started by an older
    version) is removed once it has exited."""
    owner = labels.get(OWNER_LABEL)
    if owner is not None:
        return gone(owner)
    return status in ("exited", "created", "dead")

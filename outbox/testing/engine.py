"""Finding a container engine for testcontainers: Docker, or Podman started here.

On machines without a Docker engine (this project's CI) Podman is configured as
``../shared/reference/containers-on-ci.md`` describes and its Docker-compatible API is started.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from outbox.testing.service import ServiceStartError
from outbox.testing.settings import HarnessSettings


@dataclass(frozen=True)
class Engine:
    """A reachable engine: ``kind`` is "docker" or "podman"; ``docker_host`` a DOCKER_HOST."""

    kind: str
    docker_host: str


def find_engine(settings: HarnessSettings) -> Engine | None:
    """The engine to use, starting Podman's API service if needed; None when there is none.

    Raises:
        ServiceStartError: Podman is installed but its API service does not come up.
    """
    host = os.environ.get("DOCKER_HOST") or (
        "unix:///var/run/docker.sock" if Path("/var/run/docker.sock").exists() else None
    )
    if host and _answers(host):
        return _export(Engine(_kind(host), host))
    podman = shutil.which("podman")
    if podman is None:
        return None
    os.environ["CONTAINERS_CONF"] = str(_containers_conf(settings))
    sock = _podman_socket()
    host = f"unix://{sock}"
    if not _answers(host):
        _start_podman_service(podman, sock, settings)
    return _export(Engine("podman", host))


def _export(engine: Engine) -> Engine:
    os.environ["DOCKER_HOST"] = engine.docker_host
    # These machines have /.dockerenv, so testcontainers would otherwise think it runs inside a
    # container and look for a gateway address.
    os.environ["TESTCONTAINERS_CONNECTION_MODE"] = "docker_host"
    if engine.kind == "podman":
        os.environ["TESTCONTAINERS_RYUK_DISABLED"] = "true"
    return engine


def _request(host: str, path: str, timeout: float = 2.0) -> tuple[int, bytes]:
    if not host.startswith("unix://"):
        raise ServiceStartError(f"DOCKER_HOST={host!r}: only unix sockets are supported")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(host.removeprefix("unix://"))
        sock.sendall(f"GET {path} HTTP/1.0\r\nHost: engine\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head else 0
    return status, body


def _answers(host: str) -> bool:
    try:
        return _request(host, "/_ping")[0] == 200
    except (OSError, ValueError, IndexError, ServiceStartError):
        return False


def _kind(host: str) -> str:
    try:
        version = json.loads(_request(host, "/version")[1] or b"{}")
    except (OSError, ValueError):
        return "docker"
    names = " ".join(c.get("Name", "") for c in version.get("Components", []))
    return "podman" if "Podman" in names else "docker"


def _podman_socket() -> Path:
    if os.geteuid() == 0:
        return Path("/run/podman/podman.sock")
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/podman-run-{os.geteuid()}"
    return Path(runtime) / "podman" / "podman.sock"


def _containers_conf(settings: HarnessSettings) -> Path:
    """The reference recipe: runc, cgroupfs, ulimits no higher than this machine allows."""
    nofile = _cap(resource.RLIMIT_NOFILE, 20000)
    nproc = _cap(resource.RLIMIT_NPROC, 1000)
    runc = shutil.which("runc") or "/usr/sbin/runc"
    path = settings.cache_dir / "podman" / "containers.conf"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
        "[engine]\n"
        'runtime = "runc"\n'
        'cgroup_manager = "cgroupfs"\n'
        "[engine.runtimes]\n"
        f'runc = ["{runc}"]\n'
    )
    return path


def _cap(limit: int, wanted: int) -> int:
    hard = resource.getrlimit(limit)[1]
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)


def _start_podman_service(podman: str, sock: Path, settings: HarnessSettings) -> None:
    sock.parent.mkdir(parents=True, exist_ok=True)
    log_path = settings.cache_dir / "podman" / "service.log"
    with log_path.open("ab") as log:
        # Detached on purpose: later test sessions on this machine reuse the running service.
        # Its working directory is "/", not the checkout: the runtime it spawns inherits it, and
        # once that checkout is deleted (a CI workspace wiped, a fresh clone in its place) every
        # container start fails with runc's "write child: broken pipe".
        subprocess.Popen(
            [podman, "system", "service", "--time=0", f"unix://{sock}"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd="/",
        )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if _answers(f"unix://{sock}"):
            return
        time.sleep(0.2)
    tail = log_path.read_text(errors="replace")[-2000:]
    raise ServiceStartError(
        f"podman's API service did not answer on {sock} within 20 s; its log:\n{tail}\n"
        "Check `podman info` (the recipe is in shared/reference/containers-on-ci.md)"
    )

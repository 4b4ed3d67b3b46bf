"""Local services (Kafka, PostgreSQL, the schema registry) that a killed session left running.

The local provider's twin of :func:`outbox.testing.containers.remove_left_containers`. A
session killed with -9 (a CI job cancelled, a benchmark interrupted) cannot stop the processes
it started, and ``pg_ctl`` detaches PostgreSQL from it, so no parent-death signal would reach
it either: a killed benchmark once left its Kafka and PostgreSQL running, taking memory and CPU
from every later measurement on a 2-core machine. So each local service runs with its owner in
its environment (:data:`OWNER_ENV`, :func:`outbox.testing.owners.this_process`), which every
process it forks inherits (PostgreSQL's backends too), and its folder holds the same in an
:data:`OWNER_FILE`. Before a local service starts, :func:`remove_left_processes` stops the
processes and removes the folders whose owner is gone - never those of a session still running
beside this one, nor of an owner this session cannot look up (another host, pid namespace or
boot: :func:`outbox.testing.owners.gone`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from outbox.testing import owners

#: The environment variable that names a local service process's owner.
OWNER_ENV = "OUTBOX_TESTING_OWNER"
#: The file in a local service's folder that names its owner.
OWNER_FILE = "outbox-owner"
#: The folders' name prefixes (``tempfile.mkdtemp``'s) that :func:`remove_left_processes` looks at.
PREFIXES = ("outbox-kafka-", "outbox-pg-", "outbox-cluster-", "outbox-registry-")

_ENV_PREFIX = f"{OWNER_ENV}=".encode()


def service_env() -> dict[str, str]:
    """The environment to start a local service process with: this one, and its owner."""
    return {**os.environ, OWNER_ENV: owners.this_process()}


def new_workdir(prefix: str) -> Path:
    """A fresh temporary folder for a local service, owned by this process; what killed
    sessions left is removed first."""
    remove_left_processes()
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    (folder / OWNER_FILE).write_text(owners.this_process())
    return folder


def left_processes(proc: Path = Path("/proc")) -> list[int]:
    """The processes of local services whose owner is gone (pids, ascending)."""
    judged: dict[str, bool] = {}
    left = []
    for pid, owner in _owned(proc):
        if owner not in judged:
            judged[owner] = owners.gone(owner)
        if judged[owner]:
            left.append(pid)
    return sorted(left)


def left_folders(tmp: Path | None = None) -> list[Path]:
    """The local services' folders (:data:`PREFIXES`) whose owner is gone. A folder without an
    owner file (an older session's, or one being created) is never among them."""
    root = Path(tmp or tempfile.gettempdir())
    left = []
    for folder in sorted(root.glob("outbox-*")):
        if not folder.name.startswith(PREFIXES):
            continue
        try:
            owner = (folder / OWNER_FILE).read_text()
        except OSError:
            continue
        if owners.gone(owner):
            left.append(folder)
    return left


def remove_left_processes(*, grace_s: float = 10.0, tmp: Path | None = None) -> list[int]:
    """Stop the local services' processes whose owner is gone (SIGTERM, SIGKILL after
    ``grace_s``) and remove their folders; the pids stopped."""
    pids = left_processes()
    _signal(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while (running := [p for p in pids if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    if running:
        _signal(running, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while any(_running(p) for p in running) and time.monotonic() < deadline:
            time.sleep(0.05)
    for folder in left_folders(tmp):
        shutil.rmtree(folder, ignore_errors=True)
    return pids


def _owned(proc: Path) -> Iterator[tuple[int, str]]:
    """Each process with :data:`OWNER_ENV` in its environment (those this user may read)."""
    try:
        entries = list(proc.iterdir())
    except OSError:
        return
    for entry in entries:
        if not entry.name.isdigit():
            continue
        owner = _owner_of(entry)
        if owner is not None:
            yield int(entry.name), owner


def _owner_of(entry: Path) -> str | None:
    try:
        environ = (entry / "environ").read_bytes()
    except OSError:  # gone meanwhile, or another user's
        return None
    for variable in environ.split(b"\0"):
        if variable.startswith(_ENV_PREFIX):
            return variable[len(_ENV_PREFIX) :].decode(errors="replace")
    return None


def _signal(pids: list[int], sig: signal.Signals) -> None:
    """Send ``sig`` to each pid that still carries a gone owner: through a pidfd opened
    first, so a pid the kernel gave to another process meanwhile is never signalled."""
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # gone already
            continue
        try:
            owner = _owner_of(Path(f"/proc/{pid}"))
            if owner is not None and owners.gone(owner):
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(fd, sig)
        finally:
            os.close(fd)


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: it waits only for its parent to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :][:1] not in ("Z", "X")

"""Local services (Kafka, PostgreSQL, the schema registry) that a killed session left running.

The local provider's twin of :func:`outbox.testing.containers.remove_left_containers`. A
session killed with -9 (a CI job cancelled, a benchmark interrupted) cannot stop the processes
it started, and ``pg_ctl`` detaches PostgreSQL from it, so no parent-death signal would reach
it either: a killed benchmark once left its Kafka and PostgreSQL running, taking memory and CPU
from every later measurement on a 2-core machine. So each local service's process starts with
its owner in its environment (:data:`OWNER_ENV`, :func:`outbox.testing.owners.this_process`;
PostgreSQL's postmaster, whose own children overwrite that area with their titles and end with
it), and its folder holds the same in an :data:`OWNER_FILE`. Before a local service starts,
:func:`remove_left_processes` stops the processes and removes the folders whose owner is gone -
never those of a session still running beside this one, nor of an owner this session cannot
look up (another host, pid namespace or boot: :func:`outbox.testing.owners.gone`).

The owner is the process that started the service, so that process must outlive every user of
the service: a helper process that starts one and exits leaves it to be stopped, as a killed
session would (the containers' rule too).
"""

from __future__ import annotations

import contextlib
import os
import select
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
PREFIXES = (
    "outbox-kafka-",
    "outbox-pg-",
    "outbox-cluster-",
    "outbox-registry-",
    "outbox-connect-",  # the benchmarks' Kafka Connect worker (bench/connect_worker.py)
)

_ENV_PREFIX = f"{OWNER_ENV}=".encode()


def service_env() -> dict[str, str]:
    """The environment to start a local service process with: this one, and its owner."""
    return {**os.environ, OWNER_ENV: owners.this_process()}


def new_workdir(prefix: str) -> Path:
    """A fresh temporary folder for a local service, owned by this process; what killed
    sessions left is removed first."""
    remove_left_processes()
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    written = folder / f".{OWNER_FILE}"  # renamed into place: never read half written
    written.write_text(owners.this_process())
    written.replace(folder / OWNER_FILE)
    return folder


def left_processes() -> dict[int, str]:
    """The processes of local services whose owner is gone: pid -> owner, by pid."""
    judged: dict[str, bool] = {}
    left = {}
    for pid, owner in sorted(_owned()):
        if owner not in judged:
            judged[owner] = owners.gone(owner)
        if judged[owner]:
            left[pid] = owner
    return left


def left_folders(tmp: Path | None = None) -> list[Path]:
    """The local services' folders (:data:`PREFIXES`) whose owner is gone. A folder without an
    owner file (an older session's, or one being created) is never among them."""
    root = Path(tmp or tempfile.gettempdir())
    left = []
    for folder in sorted(root.glob("outbox-*")):
        if not folder.name.startswith(PREFIXES):
            continue
        owner = _read(str(folder / OWNER_FILE))
        if owner and owners.gone(owner):
            left.append(folder)
    return left


def remove_left_processes(*, grace_s: float = 10.0, tmp: Path | None = None) -> list[int]:
    """Stop the local services' processes whose owner is gone and remove their folders; the
    pids stopped.

    PostgreSQL gets a fast shutdown (SIGINT: its clients disconnected, where SIGTERM's smart
    shutdown would wait for a killed session's orphaned relay to hang up), the others SIGTERM;
    whatever still runs after ``grace_s`` gets SIGKILL. A folder is removed only once no process
    of its owner runs any more.
    """
    left: list[_Left] = []
    try:
        for pid, owner in left_processes().items():
            left.append(_Left(pid, owner))
        for process in left:
            process.signal(signal.SIGINT if process.name == "postgres" else signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while (running := [p for p in left if p.running()]) and time.monotonic() < deadline:
            time.sleep(0.1)
        for process in running:
            process.signal(signal.SIGKILL)
        deadline = time.monotonic() + 5
        while (running := [p for p in running if p.running()]) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        for process in left:
            process.close()
    still = {process.owner for process in running}
    for folder in left_folders(tmp):
        if _read(str(folder / OWNER_FILE)) not in still:
            shutil.rmtree(folder, ignore_errors=True)
    return [process.pid for process in left]


class _Left:
    """One process of a gone owner, held by a pidfd where the kernel has them (Linux 5.3+),
    so that no signal or liveness check reaches a process that reused its pid."""

    def __init__(self, pid: int, owner: str) -> None:
        self.pid, self.owner = pid, owner
        self.name = _read(f"/proc/{pid}/comm").strip()
        self.fd: int | None = None
        #: Ended, or its pid now another process's: nothing to signal or wait for.
        self.done = False
        try:
            self.fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self.done = True
        except OSError:  # ENOSYS, EPERM: no pidfds here; the pid is checked each time
            pass
        # the pid may have gone to another process since /proc was read: the fd holds that one
        if _owner_of(Path(f"/proc/{pid}")) != owner:
            self.done = True

    def signal(self, sig: signal.Signals) -> None:
        """``sig``, if the process still carries its gone owner."""
        if self.done:
            return
        if _owner_of(Path(f"/proc/{self.pid}")) != self.owner or not owners.gone(self.owner):
            return
        with contextlib.suppress(OSError):
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, sig)
            else:
                os.kill(self.pid, sig)

    def running(self) -> bool:
        """Whether it still runs (a zombie does not: it waits only for its parent's reaping)."""
        if self.done:
            return False
        if self.fd is not None:
            poller = select.poll()
            poller.register(self.fd, select.POLLIN)
            return not poller.poll(0)  # readable once it exited
        if _owner_of(Path(f"/proc/{self.pid}")) != self.owner:
            return False  # its pid is another process's now
        try:
            state = owners.process_state(self.pid)
        except PermissionError:
            return False
        return state is not None and state[0] not in ("Z", "X")

    def close(self) -> None:
        """Let the pidfd go."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _owned() -> Iterator[tuple[int, str]]:
    """Each process with :data:`OWNER_ENV` in its environment (those this user may read)."""
    try:
        entries = list(Path("/proc").iterdir())
    except OSError:
        return
    for entry in entries:
        if not entry.name.isdigit():
            continue
        owner = _owner_of(entry)
        if owner is not None:
            yield int(entry.name), owner


def _owner_of(entry: Path) -> str | None:
    """The owner in a process's environment (``/proc/<pid>/environ``), if it has one and this
    user may read it."""
    try:
        environ = (entry / "environ").read_bytes()
    except OSError:  # gone meanwhile, or another user's
        return None
    for variable in environ.split(b"\0"):
        if variable.startswith(_ENV_PREFIX):
            return variable[len(_ENV_PREFIX) :].decode(errors="replace")
    return None


def _read(path: str) -> str:
    """A small file's text; empty when it cannot be read (gone meanwhile, another user's)."""
    try:
        return Path(path).read_text()
    except OSError:
        return ""

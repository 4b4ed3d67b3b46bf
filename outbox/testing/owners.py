"""Which process started a service container, and whether that process still runs.

A test session stops its containers when it ends; one killed (``kill -9``, a CI job cancelled)
cannot, and on Podman no Ryuk container reaps what it left. Exited containers are easy to tell
apart, but Kafka and PostgreSQL keep *running* after their session is gone, holding memory and a
share of the CPU that the next session's timing-sensitive tests and benchmarks need (two such
containers once ran for 7 hours on a 2-core machine). So each container carries its owner: the
host, the pid namespace and boot it ran in, its process id and that process's start time
(``/proc/<pid>/stat``; a pid the kernel gave to another process since has another start time).
A later session removes a container only when its owner ran where this session can see it (same
host name, pid namespace and boot: a session in another container with the same host name has
pids this one cannot look up) and is gone; any container of a process still running - another
session beside this one, one restarting its container - or of an owner it cannot see is left
alone.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

#: The label that names a container's owner (:func:`this_process`).
OWNER_LABEL = "outbox.testing.owner"


def this_process() -> str:
    """This process, as an owner label's value: ``host/pid namespace/boot id/pid/start time``
    (the namespace, boot and start time empty where ``/proc`` is not there, e.g. macOS)."""
    pid = os.getpid()
    return f"{_where()}/{pid}/{_started(pid) or ''}"


def gone(owner: str) -> bool:
    """Whether the process ``owner`` names has ended. False when that cannot be told: an owner
    on another host, in another pid namespace or boot, or a value this module did not write."""
    parts = owner.split("/")
    if len(parts) != 5 or "/".join(parts[:3]) != _where() or not parts[3].isdigit():
        return False
    pid, started = int(parts[3]), parts[4]
    if started:
        try:
            now = _started(pid)
        except PermissionError:  # it exists, and /proc will not say when it started
            return False
        if now is not None:
            return now != started
    # No start time recorded, or no /proc entry: gone unless some process has the pid (one
    # /proc hides, ``hidepid``, is someone else's and running).
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _where() -> str:
    """This host's name, pid namespace and boot, as they appear in an owner label."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        namespace = boot = ""
    return f"{socket.gethostname()}/{namespace}/{boot}"


def _started(pid: int) -> str | None:
    """The process's start time in clock ticks since boot, None when no process has ``pid``
    (or there is no ``/proc``).

    Raises:
        PermissionError: the process exists but its ``/proc`` entry cannot be read.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # after the command name, which may hold spaces and parentheses: field 22 is the 20th
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None

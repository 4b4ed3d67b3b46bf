"""Which process started a service container, and whether that process still runs.

A test session stops its containers when it ends; one killed (``kill -9``, a CI job cancelled)
cannot, and on Podman no Ryuk container reaps what it left. Exited containers are easy to tell
apart, but Kafka and PostgreSQL keep *running* after their session is gone, holding memory and a
share of the CPU that the next session's timing-sensitive tests and benchmarks need (two such
containers once ran for 7 hours on a 2-core machine). So each container carries its owner: the
host, the process id and that process's start time (``/proc/<pid>/stat``; a pid the kernel gave
to another process since has another start time). A later session removes a running container
only when its owner is on this host and gone; a container of a process still running - another
session beside this one - or of another host sharing the engine is left alone.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

#: The label that names a container's owner (:func:`this_process`).
OWNER_LABEL = "outbox.testing.owner"


def this_process() -> str:
    """This process, as an owner label's value: ``host/pid/start time`` (the start time empty
    where ``/proc`` is not there, e.g. macOS)."""
    pid = os.getpid()
    return f"{socket.gethostname()}/{pid}/{_started(pid) or ''}"


def gone(owner: str) -> bool:
    """Whether the process ``owner`` names has ended. False when that cannot be told: another
    host's process, or a value this module did not write."""
    host, _, rest = owner.partition("/")
    pid_text, _, started = rest.partition("/")
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if started:
        return _started(pid) != started
    try:  # no start time recorded: whether any process has that pid
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # someone else's process: not gone
        return False
    return False


def _started(pid: int) -> str | None:
    """The process's start time in clock ticks since boot, None when it does not run (or there
    is no ``/proc``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # after the command name, which may hold spaces and parentheses: field 22 is the 20th
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None

"""Which process started a service container, and whether that process still runs.

A test session stops its containers when it ends; one killed (``kill -9``, a CI job cancelled)
cannot, and on Podman no Ryuk container reaps what it left. Exited containers are easy to tell
apart, but Kafka and PostgreSQL keep *running* after their session is gone, holding memory and a
share of the CPU that the next session's timing-sensitive tests and benchmarks need (two such
containers once ran for 7 hours on a 2-core machine). So each container carries its owner: the
host, the pid and time namespaces and boot it ran in, its process id and that process's start
time (``/proc/<pid>/stat``; a pid the kernel gave to another process since has another start
time). A later session removes a container only when its owner ran where this session can see it
(same host name, namespaces and boot: a session in another container with the same host name
has pids this one cannot look up) and is gone (a zombie counts: killed, not yet reaped); any
container of a process still running - another session beside this one, one restarting its
container - or of an owner it cannot see is left alone. The local provider's processes carry
the same owner (:mod:`outbox.testing.left_processes`).
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

#: The label that names a container's owner (:func:`this_process`).
OWNER_LABEL = "outbox.testing.owner"


def this_process() -> str:
    """This process, as an owner label's value: ``host/pid namespace/time namespace/boot
    id/pid/start time`` (all but the host and pid empty where this process cannot read its own
    ``/proc``, e.g. macOS: such an owner is never judged gone)."""
    pid = os.getpid()
    where = _where()
    started = (process_state(pid) or ("", ""))[1] if where is not None else ""
    return f"{where or _UNKNOWN_WHERE}/{pid}/{started}"


def gone(owner: str) -> bool:
    """Whether the process ``owner`` names has ended (exited, or a zombie nobody reaped yet).
    False when that cannot be told: an owner on another host, in another pid or time namespace
    or boot, one where ``/proc`` could not be read, or a value this module did not write."""
    where = _where()
    found = _OWNER.fullmatch(owner)
    if where is None or found is None or found.group(1) != where:
        return False
    pid, started = int(found.group(2)), found.group(3)
    try:
        state = process_state(pid)
    except PermissionError:  # it exists, and /proc will not say when it started
        return False
    if state is not None:
        code, now = state
        return now != started or (code in ("Z", "X") and _threads(pid) <= 1)
    # No /proc entry: gone unless some process has the pid (one /proc hides with ``hidepid``
    # is someone else's, and running).
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False
    return False


#: An owner label this module writes when it can read ``/proc``: where, pid, start time.
_OWNER = re.compile(r"([^/]+/pid:\[[0-9]+\]/[^/]+/[0-9a-f-]{36})/([0-9]{1,10})/([0-9]{1,20})")
_UNKNOWN_WHERE = f"{socket.gethostname()}///"


def _where() -> str | None:
    """This host's name, pid and time namespaces and boot, as an owner label has them; None
    when ``/proc`` cannot tell them, or is another pid namespace's (``unshare --pid`` without
    ``--mount-proc``: its pids are not this process's)."""
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return None
        namespace = os.readlink("/proc/self/ns/pid")
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    try:  # start times are counted in the reader's time namespace (Linux 5.6 and later)
        clock = os.readlink("/proc/self/ns/time")
    except OSError:
        clock = "-"
    return f"{socket.gethostname()}/{namespace}/{clock}/{boot}"


def process_state(pid: int) -> tuple[str, str] | None:
    """The process's state code and start time (clock ticks since boot), None when no process
    has ``pid`` (or there is no ``/proc``).

    Raises:
        PermissionError: the process exists but its ``/proc`` entry cannot be read.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # after the command name, which may hold spaces and parentheses: field 3 is the first,
    # field 22 the 20th
    fields = stat.rsplit(")", 1)[-1].split()
    return (fields[0], fields[19]) if len(fields) > 19 else None


def _threads(pid: int) -> int:
    """How many threads the process has left (a zombie leader with live threads still runs)."""
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0

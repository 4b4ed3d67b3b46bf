"""Freezing a process: :func:`freeze` returns only once the process has stopped.

``kill(pid, SIGSTOP)`` returns before that: measured on the broker's JVM (105 threads, one
core otherwise idle), threads were still running right after ``kill()`` in 145 of 200 tries,
and the last stopped 5.6 ms later at the median, 30 ms at worst. A CI run of
``test_a_late_acknowledgement_holds_the_commit_until_it_comes`` saw its transaction
acknowledged and committed 6 ms after a bare ``kill()``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from outbox.testing.stopping import freeze, thaw, thread_states

BUSY = """
import threading
def spin():
    while True:
        pass
for _ in range(8):
    threading.Thread(target=spin, daemon=True).start()
print("spinning", flush=True)
threading.Event().wait()
"""


def cpu_ticks(pid: int) -> int:
    """User plus system time the process has used, in clock ticks (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def states(pid: int) -> set[str]:
    """The states of the process's threads."""
    return set(thread_states(pid).values())


def test_a_frozen_process_has_every_thread_stopped_and_uses_no_cpu_until_thawed() -> None:
    child = subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"spinning\n"
        for _ in range(20):
            freeze(child.pid)
            # Then at once every thread is stopped, and none runs on
            assert states(child.pid) <= {"T", "t"}, states(child.pid)
            before = cpu_ticks(child.pid)
            time.sleep(0.05)
            assert cpu_ticks(child.pid) == before
            thaw(child.pid)
            time.sleep(0.01)
        # And a thawed process runs again
        before = cpu_ticks(child.pid)
        time.sleep(0.2)
        assert cpu_ticks(child.pid) > before
        assert states(child.pid) - {"T", "t"}
    finally:
        child.kill()
        child.wait()


def test_freezing_an_exited_process_says_it_is_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    while "Z" not in states(child.pid):  # exited, not yet reaped: a zombie
        time.sleep(0.01)
    with pytest.raises(ProcessLookupError, match="exiting"):
        freeze(child.pid, timeout=5)
    child.wait()
    with pytest.raises(ProcessLookupError):
        freeze(child.pid, timeout=5)

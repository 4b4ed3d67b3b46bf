"""Stopping a service's process the way the harness stops every one it starts: SIGTERM and a
wait for a clean shutdown, then SIGKILL to the whole process group (a JVM's launcher and what
it forked) when it takes too long. The broker, the schema registry and the benchmarks' Kafka
Connect worker all stop this way. Freezing one (SIGSTOP, for a broker that stops answering
with its connections open) waits until the process has really stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def stop(proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
    """SIGTERM and wait up to ``timeout`` s; :func:`kill` after that. Nothing when not running."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        kill(proc)


def kill(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL the process group (started with ``start_new_session=True``) and reap it."""
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def freeze(pid: int, timeout: float = 10.0) -> None:
    """SIGSTOP ``pid`` and return once every one of its threads is stopped.

    ``kill()`` returns before the process stops: the kernel wakes one thread to take the
    signal, and only when that thread runs does it stop the others. On a loaded machine a JVM
    went on answering requests for milliseconds after ``kill()`` returned, so a test that
    needs the broker silent from a given instant waits for Linux's thread states (``T``).

    Raises:
        TimeoutError: some thread was still running after ``timeout`` s (the process is
            continued first, so that nothing is left frozen by a failed freeze).
        ProcessLookupError: the process is gone, or exiting.
    """
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while True:
        running = _running_threads(pid)
        if not running:
            return
        if time.monotonic() > deadline:
            thaw(pid)
            raise TimeoutError(f"threads {running} of process {pid} not stopped after {timeout} s")
        time.sleep(0.001)


def thaw(pid: int) -> None:
    """SIGCONT: undo :func:`freeze`."""
    os.kill(pid, signal.SIGCONT)


def thread_states(pid: int) -> dict[int, str]:
    """Each thread of ``pid`` and its state in ``/proc`` (``R`` running, ``S`` sleeping, ``T``
    stopped, ``Z`` zombie, ...); a thread that ends while they are read is left out.

    Raises:
        ProcessLookupError: no such process.
    """
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        raise ProcessLookupError(f"process {pid} is gone") from None
    states = {}
    for task in tasks:
        try:
            stat = (task / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            continue
        states[int(task.name)] = stat.rsplit(")", 1)[1].split()[0]
    return states


def _running_threads(pid: int) -> list[int]:
    """The threads of ``pid`` not yet stopped (nor ended).

    Raises:
        ProcessLookupError: no such process, or it is exiting (its first thread a zombie).
    """
    states = thread_states(pid)
    if states.get(pid) in ("Z", "X"):
        raise ProcessLookupError(f"process {pid} is exiting: nothing to freeze")
    return [thread for thread, state in states.items() if state not in ("T", "t", "Z", "X")]

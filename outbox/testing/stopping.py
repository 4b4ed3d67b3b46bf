"""Stopping a service's process the way the harness stops every one it starts: SIGTERM and a
wait for a clean shutdown, then SIGKILL to the whole process group (a JVM's launcher and what
it forked) when it takes too long. The broker, the schema registry and the benchmarks' Kafka
Connect worker all stop this way."""

from __future__ import annotations

import os
import signal
import subprocess


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

"""A deployment's supervisor for the service processes the tests start: a relay or checker that
gives up stuck (exit 3, :mod:`outbox.watchdog`) is started again, as Kubernetes, compose's
restart policy or systemd would; and what such a process is doing, for a failure report."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from outbox.watchdog import EXIT_STUCK


class Supervised(Protocol):
    proc: subprocess.Popen[Any] | None
    stopping: bool
    stuck_exits: int

    def start(self) -> Any: ...


def restart_when_stuck(service: Supervised, name: str) -> threading.Thread:
    """Start ``service`` again whenever it exits stuck, until it is being stopped; counts the
    restarts in ``service.stuck_exits``."""

    def loop() -> None:
        while not service.stopping:
            proc = service.proc
            if proc is not None and proc.poll() == EXIT_STUCK:
                service.stuck_exits += 1
                service.start()
            time.sleep(0.5)

    thread = threading.Thread(target=loop, name=f"supervise-{name}", daemon=True)
    thread.start()
    return thread


def stacks(proc: subprocess.Popen[Any] | None, log: Path) -> str:
    """Every thread's stack of a relay or checker process (SIGUSR1 makes it write them to its
    log, ``log``; librdkafka's own lines left out)."""
    if proc is None or proc.poll() is not None:
        return f"(not running: exit code {None if proc is None else proc.returncode})"
    size = log.stat().st_size
    proc.send_signal(signal.SIGUSR1)
    time.sleep(1)
    text = log.read_bytes()[size:].decode(errors="replace")
    return "\n".join(line for line in text.splitlines() if not line.startswith("%"))

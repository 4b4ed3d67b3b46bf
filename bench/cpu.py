"""Where a run's CPU went, by process role, read from ``/proc``.

A latency measured on a saturated machine is a queue's, whatever the code under test does; the
end-to-end scenario records, beside each run's latencies, how many cores the load generator,
the relay, the broker and the database used, and how busy the machine was. Roles are found by
what a process runs (the broker: a JVM running ``kafka.Kafka``; the database: processes named
``postgres``), so brokers and servers in containers on this kernel count too; on a host
without ``/proc``, or where a role runs on another machine, its figure is NaN, never zero.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

PROC = Path("/proc")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

#: Role -> the process ids it has now (looked up at each reading: database backends come and go).
Roles = Mapping[str, Callable[[], Iterable[int]]]


def cpu_seconds(pid: int) -> float | None:
    """User + system time of ``pid`` (not its children's: the benchmark process reaps relays
    of earlier scenarios); None when the process is gone."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime


def _cmdline(pid: str) -> list[bytes]:
    try:
        return (PROC / pid / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def _comm(pid: str) -> str:
    try:
        return (PROC / pid / "comm").read_text().strip()
    except OSError:
        return ""


def _pids() -> list[str]:
    try:
        return [p for p in os.listdir(PROC) if p.isdigit()]
    except OSError:
        return []


def kafka_brokers() -> list[int]:
    """JVMs running ``kafka.Kafka`` (the broker's main class, in both ways ours are started)."""
    return [int(p) for p in _pids() if b"kafka.Kafka" in _cmdline(p)]


def postgres_servers() -> list[int]:
    return [int(p) for p in _pids() if _comm(p) == "postgres"]


def machine_busy_seconds() -> tuple[float, float] | None:
    """(busy, total) CPU seconds of the whole machine since boot, over every core."""
    try:
        first = (PROC / "stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    ticks = [int(x) for x in first[1:9]]  # user nice system idle iowait irq softirq steal
    idle = ticks[3] + ticks[4]
    return (sum(ticks) - idle) / _TICK, sum(ticks) / _TICK


class CpuMeter:
    """Cores used per role between :meth:`start` and :meth:`stop` (CPU seconds / wall seconds).

    ``busy`` in the result is the whole machine's busy cores (every process, and the kernel).
    """

    def __init__(self, roles: Roles) -> None:
        self.roles = roles
        self._start: dict[str, dict[int, float]] = {}
        self._machine: tuple[float, float] | None = None
        self._wall = 0.0

    def _read(self) -> dict[str, dict[int, float]]:
        out: dict[str, dict[int, float]] = {}
        for role, pids in self.roles.items():
            seconds = {pid: cpu_seconds(pid) for pid in pids()}
            out[role] = {pid: s for pid, s in seconds.items() if s is not None}
        return out

    def start(self) -> None:
        self._start = self._read()
        self._machine = machine_busy_seconds()
        self._wall = time.monotonic()

    def stop(self) -> dict[str, float]:
        end, machine = self._read(), machine_busy_seconds()
        wall = time.monotonic() - self._wall
        cores: dict[str, float] = {}
        for role in self.roles:
            before, after = self._start.get(role, {}), end.get(role, {})
            # a process that started during the run counts from zero; one that ended during it
            # is lost (the scenarios' database connections are pooled, so backends stay)
            used = sum(s - before.get(pid, 0.0) for pid, s in after.items())
            cores[role] = used / wall if after and wall > 0 else math.nan
        if machine is not None and self._machine is not None:
            busy, total = machine[0] - self._machine[0], machine[1] - self._machine[1]
            cores["busy"] = (os.cpu_count() or 1) * busy / total if total > 0 else math.nan
        else:
            cores["busy"] = math.nan
        return cores

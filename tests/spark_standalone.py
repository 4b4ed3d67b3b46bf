"""A Spark standalone cluster - a master and workers - run from pyspark's own distribution.

The PyPI pyspark package carries Spark's jars and ``bin/spark-class`` but not the ``sbin``
start scripts, so the master and the workers are started as their Java main classes, as
``sbin/start-master.sh`` and ``start-worker.sh`` would. Everything binds to 127.0.0.1 on free
ports (the master's REST submission server, on by default at the fixed port 6066, is turned off)
so several test sessions can share a machine. The workers are small - one core and
:data:`WORKER_MEMORY` each - so a 2-core machine that also runs Kafka and PostgreSQL fits them.

This lives under ``tests/`` rather than ``outbox.testing``: it needs pyspark, which the library
and its harness must not.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from outbox.testing.ports import free_port
from outbox.testing.service import ServiceStartError

#: What each worker offers to executors: an executor of 512 MiB heap fits, with room to spare.
WORKER_MEMORY = "768m"
WORKER_CORES = 1
#: The heap of the master's and workers' own JVMs (Spark's default is 1 GiB each).
DAEMON_MEMORY = "256m"


def spark_home() -> Path:
    """The pip-installed pyspark's folder, which is a Spark home (``bin/``, ``jars/``)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise ServiceStartError("pyspark is not installed; run `make setup`")
    return Path(spec.origin).parent


class StandaloneCluster:
    """``spark://127.0.0.1:<port>`` with ``workers`` workers; logs and work folders in
    ``workdir`` (each worker keeps its executors' stdout/stderr under ``worker-N/<app-id>``)."""

    def __init__(self, workdir: Path, *, workers: int = 2) -> None:
        self.workdir = workdir
        self.home = spark_home()
        self.port = free_port()
        self.ui_port = free_port()
        self.worker_dirs = [workdir / f"worker-{n}" for n in range(1, workers + 1)]
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The environment for the daemons, and for spark-submit against them."""
        conf = self.workdir / "conf"
        conf.mkdir(exist_ok=True)  # an empty SPARK_CONF_DIR: no stray spark-defaults.conf
        return {
            **os.environ,
            "SPARK_HOME": str(self.home),
            "SPARK_CONF_DIR": str(conf),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        }

    def _spawn(self, name: str, main: str, *args: str) -> None:
        log = (self.workdir / f"{name}.log").open("ab")
        command = [str(self.home / "bin" / "spark-class"), main, *args]
        self.procs.append(
            subprocess.Popen(
                command,
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

    def start(self, timeout: float = 120.0) -> None:
        """Start the master, then the workers; return once every worker has registered.

        Raises:
            ServiceStartError: a daemon exited, or the workers were not all ALIVE in time.
        """
        self._spawn(
            "master",
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", str(self.port)),
            *("--webui-port", str(self.ui_port)),
        )
        atexit.register(self.stop)  # pytest killed or interrupted: no daemons left behind
        for n, folder in enumerate(self.worker_dirs, start=1):
            folder.mkdir(parents=True, exist_ok=True)
            self._spawn(
                f"worker-{n}",
                "org.apache.spark.deploy.worker.Worker",
                *("--host", "127.0.0.1", "--webui-port", str(free_port())),
                *("--cores", str(WORKER_CORES), "--memory", WORKER_MEMORY),
                *("--work-dir", str(folder)),
                self.url,
            )
        try:
            self._wait_for_workers(timeout)
        except ServiceStartError as err:
            self.stop()
            raise ServiceStartError(f"{err}\n--- master log tail ---\n{self.logs(40)}") from err

    def _wait_for_workers(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        alive = 0
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                raise ServiceStartError(
                    f"a Spark daemon exited while starting (logs in {self.workdir})"
                )
            try:
                alive = sum(w["state"] == "ALIVE" for w in self.status()["workers"])
            except (OSError, ValueError):  # the master's UI is not up yet
                alive = 0
            if alive == len(self.worker_dirs):
                return
            time.sleep(1)
        raise ServiceStartError(
            f"{alive} of {len(self.worker_dirs)} Spark workers registered with {self.url} "
            f"within {timeout:.0f} s"
        )

    def status(self) -> dict[str, Any]:
        """The master's own view (its web UI's ``/json/``): workers, running and completed apps."""
        url = f"http://127.0.0.1:{self.ui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as response:
            found: dict[str, Any] = json.load(response)
            return found

    def executor_folders(self, app_id: str) -> list[Path]:
        """The folders the workers made for ``app_id``'s executors (one per executor)."""
        return sorted(p for w in self.worker_dirs for p in (w / app_id).glob("*") if p.is_dir())

    def logs(self, tail: int = 40) -> str:
        path = self.workdir / "master.log"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        return "\n".join(lines[-tail:])

    def stop(self) -> None:
        """Kill the workers (and with them their executors), then the master."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

"""A single-node KRaft broker run as a local Java process from the Maven-resolved jars.

This is what the distribution's scripts do (``kafka-storage.sh format``, ``kafka-server-start.sh``),
spelled as Java main classes, so no download site is needed.
"""

from __future__ import annotations

import atexit
import shutil
import subprocess
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

from outbox.testing import stopping
from outbox.testing.left_processes import new_workdir, service_env
from outbox.testing.ports import free_port
from outbox.testing.readiness import wait_for_kafka
from outbox.testing.service import RunningService, ServiceStartError
from outbox.testing.settings import HarnessSettings

HEAP = "-Xmx768m"


def server_properties(
    *,
    port: int,
    controller_port: int,
    log_dir: Path,
    extra: Mapping[str, str] | None = None,
) -> str:
    """A combined broker+controller config with replication factor 1 everywhere.

    A single broker needs factor 1 and min ISR 1 for the offsets and transaction-state topics or
    ``init_transactions()`` never completes. ``extra`` adds settings or replaces these (a second
    listener, an authorizer); ``{port}`` and ``{controller_port}`` in its values are this
    broker's.
    """
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(log_dir),
        "num.partitions": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "4",
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "true",
        "log.cleaner.backoff.ms": "1000",
    }
    for key, value in (extra or {}).items():
        settings[key] = value.replace("{port}", str(port)).replace(
            "{controller_port}", str(controller_port)
        )
    return "\n".join([*(f"{k}={v}" for k, v in settings.items()), ""])


class KafkaProcess:
    """Formats a data folder and runs ``kafka.Kafka`` on free loopback ports."""

    def __init__(
        self,
        settings: HarnessSettings,
        workdir: Path | None = None,
        *,
        jars_dir: Path | None = None,
        heap: str = HEAP,
        extra_properties: Mapping[str, str] | None = None,
    ) -> None:
        """``extra_properties``: broker settings added to or replacing the defaults
        (:func:`server_properties`)."""
        self.settings = settings
        self.extra_properties = dict(extra_properties or {})
        self.classpath = settings.kafka_classpath(jars_dir)
        self.heap = heap
        self.java = shutil.which("java")
        if self.java is None:
            raise ServiceStartError("no `java` on PATH; install a Java 17 runtime (openjdk-17-jre)")
        self.workdir = workdir or new_workdir("outbox-kafka-")
        self.port = free_port()
        self.controller_port = free_port()
        self.config = self.workdir / "server.properties"
        self.log_file = self.workdir / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _java(self, main: str, *args: str, log: Path) -> list[str]:
        log4j = resources.files("outbox.testing") / "resources" / "log4j2.properties"
        return [
            str(self.java),
            self.heap,
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={log4j}",
            f"-Dkafka.logs.file={log}",
            "-cp",
            self.classpath,
            main,
            *args,
        ]

    def format(self) -> None:
        data = self.workdir / "data"
        self.config.write_text(
            server_properties(
                port=self.port,
                controller_port=self.controller_port,
                log_dir=data,
                extra=self.extra_properties,
            )
        )
        cluster_id = _run(self._java("kafka.tools.StorageTool", "random-uuid", log=self.log_file))
        _run(
            self._java(
                "kafka.tools.StorageTool",
                "format",
                "-t",
                cluster_id.strip().splitlines()[-1],
                "-c",
                str(self.config),
                log=self.log_file,
            )
        )

    def launch(self) -> None:
        """Start the process without waiting for it to serve (a cluster's nodes start together:
        none of them serves before a quorum of controllers is up)."""
        with (self.workdir / "stdout.log").open("ab") as out:
            self.proc = subprocess.Popen(
                self._java("kafka.Kafka", str(self.config), log=self.log_file),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=service_env(),
            )
        atexit.register(self.kill)

    def start(self, timeout: float = 90.0) -> None:
        self.launch()
        try:
            wait_for_kafka(self.bootstrap, timeout=timeout, alive=self.alive)
        except ServiceStartError as err:
            self.kill()
            raise ServiceStartError(f"{err}\n--- broker log tail ---\n{self.logs(60)}") from err

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM and wait for a clean shutdown; SIGKILL when it takes too long."""
        stopping.stop(self.proc, timeout)

    def kill(self) -> None:
        stopping.kill(self.proc)

    def restart(self) -> None:
        self.stop()
        self.start()

    def logs(self, tail: int | None = None) -> str:
        text = self.log_file.read_text(errors="replace") if self.log_file.exists() else ""
        stdout = self.workdir / "stdout.log"
        if stdout.exists():
            text += stdout.read_text(errors="replace")
        lines = text.splitlines()
        return "\n".join(lines[-tail:] if tail else lines)


def start_kafka_process(settings: HarnessSettings) -> RunningService:
    """Start a broker as a local process; its data folder is removed on ``stop()``."""
    broker = KafkaProcess(settings)
    broker.format()
    broker.start()

    def stop() -> None:
        broker.stop()
        shutil.rmtree(broker.workdir, ignore_errors=True)

    return RunningService(
        name="kafka",
        provider="local",
        address=broker.bootstrap,
        _stop=stop,
        _logs=broker.logs,
        _restart=broker.restart,
    )


def _run(cmd: list[str]) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
    if done.returncode != 0:
        raise ServiceStartError(
            f"`{' '.join(cmd[-4:])}` failed ({done.returncode}): {done.stderr or done.stdout}"
        )
    return done.stdout

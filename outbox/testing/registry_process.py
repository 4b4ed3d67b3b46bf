"""A schema registry run as a local Java process: Apicurio Registry, storage in memory.

Tests serialize with confluent-kafka's ``AvroSerializer`` / ``JSONSerializer`` against a real
registry, and Apicurio serves the Confluent-compatible API at ``/apis/ccompat/v7``, which those
clients speak. ``make jars`` builds it from Maven Central (``jvm/schema-registry/pom.xml`` says
which version and why); nothing is downloaded at test time. It needs no other service (its
storage is an in-memory H2 database), so it always runs as a local process, whichever provider
runs Kafka: a container engine would add only start-up time.
"""

from __future__ import annotations

import atexit
import shutil
import subprocess
from pathlib import Path

from outbox.testing import stopping
from outbox.testing.left_processes import new_workdir, service_env
from outbox.testing.ports import free_port
from outbox.testing.readiness import wait_for_schema_registry
from outbox.testing.service import RunningService, ServiceStartError
from outbox.testing.settings import HarnessSettings

HEAP = "-Xmx384m"
#: Where Apicurio serves the Confluent Schema Registry API (the clients' ``url``).
CCOMPAT_PATH = "/apis/ccompat/v7"


class RegistryProcess:
    """Runs the registry's jar on a free loopback port, its temporary files in its own folder."""

    def __init__(self, settings: HarnessSettings, workdir: Path | None = None) -> None:
        self.jar = settings.schema_registry_jar()
        self.java = shutil.which("java")
        if self.java is None:
            raise ServiceStartError("no `java` on PATH; install a Java 17 runtime (openjdk-17-jre)")
        self.workdir = workdir or new_workdir("outbox-registry-")
        self.port = free_port()
        self.log_file = self.workdir / "registry.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The Confluent-compatible API: what ``SchemaRegistryClient({"url": ...})`` takes."""
        return self.base + CCOMPAT_PATH

    def start(self, timeout: float = 90.0) -> None:
        """Start it and wait until its health endpoint says UP and its API answers.

        Raises:
            ServiceStartError: it did not get ready within ``timeout`` (with its log's tail).
        """
        tmp = self.workdir / "tmp"
        tmp.mkdir(exist_ok=True)
        command = [
            str(self.java),
            HEAP,
            "-Djava.awt.headless=true",
            f"-Djava.io.tmpdir={tmp}",
            f"-Dquarkus.http.port={self.port}",
            "-Dquarkus.http.host=127.0.0.1",
            "-jar",
            str(self.jar),
        ]
        with self.log_file.open("ab") as out:
            self.proc = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=service_env(),
            )
        atexit.register(self.kill)
        try:
            wait_for_schema_registry(
                self.url, health_url=f"{self.base}/health/ready", timeout=timeout, alive=self.alive
            )
        except ServiceStartError as err:
            self.kill()
            raise ServiceStartError(f"{err}\n--- registry log tail ---\n{self.logs(60)}") from err

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM and wait; SIGKILL when it takes too long."""
        stopping.stop(self.proc, timeout)

    def kill(self) -> None:
        stopping.kill(self.proc)

    def logs(self, tail: int | None = None) -> str:
        text = self.log_file.read_text(errors="replace") if self.log_file.exists() else ""
        lines = text.splitlines()
        return "\n".join(lines[-tail:] if tail else lines)


def start_registry_process(settings: HarnessSettings) -> RunningService:
    """Start the registry; its folder is removed on ``stop()``. ``address`` is its
    Confluent-compatible API's URL.

    Raises:
        ServiceStartError: no jar (run ``make jars``), no java, or it did not get ready.
    """
    registry = RegistryProcess(settings)
    try:
        registry.start()
    except ServiceStartError:
        shutil.rmtree(registry.workdir, ignore_errors=True)
        raise

    def stop() -> None:
        registry.stop()
        shutil.rmtree(registry.workdir, ignore_errors=True)

    return RunningService(
        name="schema-registry",
        provider="local",
        address=registry.url,
        _stop=stop,
        _logs=registry.logs,
    )

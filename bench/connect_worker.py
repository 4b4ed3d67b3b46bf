"""Baseline C's relay: a Kafka Connect standalone worker running Debezium's PostgreSQL connector
with its outbox EventRouter, as a local Java process from the jars ``make jars`` resolves
(jvm/connect/pom.xml).

What a Kafka team most often deploys: the connector decodes the outbox table's inserts from
the WAL (``pgoutput``, a publication for that table only), the EventRouter SMT turns each row
into a record on the topic its ``aggregatetype`` names, keyed by ``aggregateid``, with the
``payload`` bytes as the value. ``snapshot.mode=no_data``: only rows committed after the slot
was created flow. Standalone keeps the source offsets in a file; the slot is kept when the
worker stops (``slot.drop.on.stop=false``), so a restarted worker resumes where it stopped, and
:func:`drop_slot` removes it at the end. Standalone Connect is at least once (exactly-once
source support needs a distributed worker).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import sqlalchemy as sa

from outbox.testing import stopping
from outbox.testing.left_processes import new_workdir, service_env
from outbox.testing.ports import free_port
from outbox.testing.service import ServiceStartError
from outbox.testing.settings import HarnessSettings

CONNECTOR = "outbox-c"
MAIN = "org.apache.kafka.connect.cli.ConnectStandalone"
HEAP = "-Xmx512m"
#: The record header the bench's watcher reads (bench/watch.py), from the table's ``seq`` column.
SEQ_HEADER = "bench-seq"


@dataclass(frozen=True, kw_only=True)
class DebeziumSettings:
    """One connector: where it reads, where it writes, how often it polls.

    Attributes:
        bootstrap: the broker's ``host:port``.
        db_url: the SQLAlchemy URL of the PostgreSQL database with the outbox table.
        slot: the replication slot's name (one per database and connector).
        table: the outbox table. Defaults to ``public.outboxevent``, Debezium's own example.
        poll_interval_ms: ``poll.interval.ms``, how long the task waits when its queue is empty.
            Defaults to 100, baseline B's polling interval (Debezium's own default is 500).
    """

    bootstrap: str
    db_url: str
    slot: str
    table: str = "public.outboxevent"
    poll_interval_ms: int = 100

    def __post_init__(self) -> None:
        if not self.slot.replace("_", "").isalnum() or self.slot.lower() != self.slot:
            raise ValueError(
                f"slot {self.slot!r}: PostgreSQL slot names are lower-case letters, digits and _"
            )


def connect_classpath(harness: HarnessSettings) -> str:
    """The worker's classpath; fails with the fix when ``make jars`` has not resolved it."""
    jars = harness.cache_dir / "jvm" / "connect"
    if not any(jars.glob("debezium-connector-postgres-*.jar")):
        raise ServiceStartError(
            f"no Kafka Connect / Debezium jars in {jars}; run `make jars` (resolves "
            "jvm/connect/pom.xml from Maven Central)"
        )
    return str(jars / "*")


def worker_properties(bootstrap: str, offsets: Path, rest_port: int) -> str:
    """A standalone worker: offsets in a file, REST on loopback, bytes in and out."""
    return "\n".join(
        [
            f"bootstrap.servers={bootstrap}",
            "key.converter=org.apache.kafka.connect.storage.StringConverter",
            "value.converter=org.apache.kafka.connect.converters.ByteArrayConverter",
            f"offset.storage.file.filename={offsets}",
            "offset.flush.interval.ms=1000",
            f"listeners=http://127.0.0.1:{rest_port}",
            # every plugin on the classpath has a ServiceLoader manifest (Connect says so at
            # start-up): no reflective scan of the whole classpath, seconds less to start
            "plugin.discovery=service_load",
            "",
        ]
    )


def connector_properties(settings: DebeziumSettings) -> str:
    """Debezium's PostgreSQL connector with the outbox EventRouter, routed by aggregatetype."""
    url = sa.make_url(settings.db_url)
    schema, _, name = settings.table.rpartition(".")
    lines = [
        f"name={CONNECTOR}",
        "connector.class=io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max=1",
        f"database.hostname={url.host or '127.0.0.1'}",
        f"database.port={url.port or 5432}",
        f"database.user={url.username or 'postgres'}",
        f"database.password={url.password or ''}",
        f"database.dbname={url.database}",
        f"topic.prefix={CONNECTOR}",
        "plugin.name=pgoutput",
        f"slot.name={settings.slot}",
        "slot.drop.on.stop=false",
        f"publication.name={settings.slot}_pub",
        "publication.autocreate.mode=filtered",
        f"table.include.list={schema or 'public'}.{name}",
        "snapshot.mode=no_data",
        f"poll.interval.ms={settings.poll_interval_ms}",
        "transforms=outbox",
        "transforms.outbox.type=io.debezium.transforms.outbox.EventRouter",
        "transforms.outbox.route.by.field=aggregatetype",
        "transforms.outbox.route.topic.replacement=${routedByValue}",
        f"transforms.outbox.table.fields.additional.placement=seq:header:{SEQ_HEADER}",
        "",
    ]
    return "\n".join(lines)


class ConnectWorker:
    """One standalone worker with one connector; ``start()`` returns once its task runs.

    The same worker folder (and so the same offsets file) is reused by ``start()`` after
    ``stop()``: the connector resumes from its slot.
    """

    def __init__(self, harness: HarnessSettings, settings: DebeziumSettings) -> None:
        self.settings = settings
        self.classpath = connect_classpath(harness)
        java = shutil.which("java")
        if java is None:
            raise ServiceStartError("no `java` on PATH; install a Java 17 runtime (openjdk-17-jre)")
        self.java = java
        self.workdir = new_workdir("outbox-connect-")
        self.rest_port = free_port()
        self.log_file = self.workdir / "connect.log"
        self.worker_file = self.workdir / "worker.properties"
        self.worker_file.write_text(
            worker_properties(settings.bootstrap, self.workdir / "offsets.dat", self.rest_port)
        )
        self.connector_file = self.workdir / "connector.properties"
        self.connector_file.write_text(connector_properties(settings))
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        log4j = resources.files("outbox.testing") / "resources" / "log4j2.properties"
        return [
            self.java,
            HEAP,
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={log4j}",
            f"-Dkafka.logs.file={self.log_file}",
            "-cp",
            self.classpath,
            MAIN,
            str(self.worker_file),
            str(self.connector_file),
        ]

    def start(self, timeout: float = 120.0) -> ConnectWorker:
        """Start the worker and wait until the connector's task runs and its slot is active.

        Raises:
            ServiceStartError: the worker died, the task failed, or the time ran out; with the
                log's tail.
        """
        out = (self.workdir / "stdout.log").open("ab")
        self.proc = subprocess.Popen(
            self.command(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=service_env(),  # stopped by a later start if this process is killed
        )
        out.close()
        self._wait(self._streaming, timeout, "streaming")
        return self

    def stop_connector(self, timeout: float = 60.0) -> None:
        """Stop the connector's task, the JVM running on (Connect's ``PUT .../stop``): its
        offsets are committed, and :meth:`resume_connector` goes on from them and its slot.

        Raises:
            ServiceStartError: the task did not stop in time.
        """
        self._put("stop")
        self._wait(self._stopped, timeout, "stopped")

    def resume_connector(self, timeout: float = 60.0) -> None:
        """Restart the stopped connector's task and wait until it streams again.

        Raises:
            ServiceStartError: the task failed or did not stream in time.
        """
        self._put("resume")
        self._wait(self._streaming, timeout, "streaming")

    def _put(self, action: str) -> None:
        url = f"http://127.0.0.1:{self.rest_port}/connectors/{CONNECTOR}/{action}"
        request = urllib.request.Request(url, method="PUT")
        with urllib.request.urlopen(request, timeout=30):
            pass

    def _wait(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if not self.alive() or time.monotonic() > deadline:
                self.kill()
                raise ServiceStartError(
                    f"Kafka Connect: connector {CONNECTOR} not {what} within {timeout:.0f} s "
                    f"(status {self.status()}):\n{self.logs(40)}"
                )
            time.sleep(0.2)

    def _stopped(self) -> bool:
        status = self.status()
        connector = status.get("connector") if status else None
        return isinstance(connector, dict) and connector.get("state") == "STOPPED"

    def status(self) -> dict[str, object] | None:
        """The connector's status from the worker's REST API; None before it answers."""
        url = f"http://127.0.0.1:{self.rest_port}/connectors/{CONNECTOR}/status"
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                status: dict[str, object] = json.loads(reply.read())
                return status
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def _streaming(self) -> bool:
        status = self.status()
        tasks = status.get("tasks") if status else None
        if not isinstance(tasks, list) or not tasks:
            return False
        state = tasks[0].get("state")
        if state == "FAILED":
            raise ServiceStartError(f"Debezium task failed:\n{tasks[0].get('trace', '')}")
        return state == "RUNNING" and slot_active(self.settings.db_url, self.settings.slot)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pid(self) -> int | None:
        return self.proc.pid if self.alive() and self.proc is not None else None

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (the worker commits its offsets and stops the task); SIGKILL after
        ``timeout``."""
        stopping.stop(self.proc, timeout)

    def kill(self) -> None:
        stopping.kill(self.proc)

    def close(self) -> None:
        """Stop the worker, drop its slot, remove its folder."""
        self.stop()
        drop_slot(self.settings.db_url, self.settings.slot)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def logs(self, tail: int | None = None) -> str:
        text = ""
        for path in (self.log_file, self.workdir / "stdout.log"):
            if path.exists():
                text += path.read_text(errors="replace")
        lines = text.splitlines()
        return "\n".join(lines[-tail:] if tail else lines)


def slot_active(db_url: str, slot: str) -> bool:
    """The replication slot exists and a walsender streams from it."""
    engine = sa.create_engine(db_url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            active = conn.execute(
                sa.text("SELECT active FROM pg_replication_slots WHERE slot_name = :s"), {"s": slot}
            ).scalar()
    finally:
        engine.dispose()
    return bool(active)


def drop_slot(db_url: str, slot: str, timeout: float = 15.0) -> None:
    """Drop the slot (a kept slot holds WAL back for ever), waiting for its walsender to end
    after the worker stopped."""
    engine = sa.create_engine(db_url, poolclass=sa.pool.NullPool)
    query = sa.text(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
        "WHERE slot_name = :s AND NOT active"
    )
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            with engine.begin() as conn:
                conn.execute(query, {"s": slot})
                left = conn.execute(
                    sa.text("SELECT count(*) FROM pg_replication_slots WHERE slot_name = :s"),
                    {"s": slot},
                ).scalar()
            if not left:
                return
            time.sleep(0.2)
    finally:
        engine.dispose()

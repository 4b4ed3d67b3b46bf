"""The relay path for baseline C: a preloaded backlog drained by Debezium's connector.

One Connect worker serves the warm-up and the timed runs, as a production worker runs for
days: its connector first starts on the empty outbox table (``snapshot.mode=no_data``: it
creates its slot and publication) and is stopped (Connect's ``PUT .../stop``, the JVM running
on). Each run preloads N rows (to a fresh topic: ``aggregatetype`` names it) and resumes the
connector, which reads the backlog from its slot, as after a connector restart or an outage.
Measured as for ours and B (bench/relay_path.py): from the first to the last record visible to
a read_committed consumer; the start-up is the task's restart until the first record. One
connector only: a PostgreSQL slot has one reader, Debezium's connector one task.
"""

from __future__ import annotations

import uuid

from bench.baseline_c import create_outbox_table, preload_outbox
from bench.config import BenchConfig
from bench.connect_worker import ConnectWorker, DebeziumSettings
from bench.drain import drain
from bench.procs import Context, create_topic, unique
from bench.services import Services, engine_for


class WorkerRelay:
    """The worker's connector as the relay path's ``drain`` drives a relay process: ``start``
    resumes it, ``stop`` stops it."""

    def __init__(self, worker: ConnectWorker, name: str) -> None:
        self.worker, self.name = worker, name

    def start(self) -> WorkerRelay:
        self.worker.resume_connector()
        return self

    def stop(self) -> int | None:
        self.worker.stop_connector()
        return None

    def log_text(self) -> str:
        return self.worker.logs()

    def tail(self, lines: int = 30) -> str:
        return self.worker.logs(lines)


class ConnectorRuns:
    """The runs of the baseline C row, on one worker; call it as the relay path's
    ``run_once(count, warmup=...)``, then :meth:`close`."""

    def __init__(self, services: Services, ctx: Context, config: BenchConfig) -> None:
        self.services, self.ctx = services, ctx
        self.url = services.database("postgresql", "relay_c")
        engine = engine_for(self.url)
        create_outbox_table(engine)
        engine.dispose()
        self.settings = DebeziumSettings(
            bootstrap=services.bootstrap,
            db_url=self.url,
            slot=f"bench_{uuid.uuid4().hex[:8]}",
            poll_interval_ms=int(config.poll_interval_s * 1000),
        )
        self.worker = ConnectWorker(services.harness, self.settings)
        self.worker.start()  # creates the slot and the publication on an empty outbox
        self.worker.stop_connector()

    def __call__(self, count: int, *, warmup: bool = False) -> dict[str, float]:
        topic = unique("bench-relayed-c")
        create_topic(self.services.bootstrap, topic)
        engine = engine_for(self.url)
        preload_outbox(engine, topic, count)
        engine.dispose()
        name = f"{'warmup-' if warmup else ''}connect-{topic}"
        relay = WorkerRelay(self.worker, name)
        return drain(self.ctx, self.services, topic, count, [relay], group=False)

    def close(self) -> None:
        (self.ctx.logs / f"connect-{self.settings.slot}.log").write_text(self.worker.logs())
        self.worker.close()


def note(config: BenchConfig) -> str:
    return (
        "Baseline C: Debezium's PostgreSQL connector with the outbox EventRouter on one Kafka "
        "Connect standalone worker for the row (warm-up and runs), its connector stopped while "
        "the backlog is preloaded and resumed on it (start-up: the task's restart); "
        f"poll.interval.ms {config.poll_interval_s * 1000:.0f}, the other settings Debezium's "
        "and Connect's defaults; one connector (one slot, one task), so no two-relay row."
    )

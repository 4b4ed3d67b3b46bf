"""One end-to-end pipeline: a fresh database, one relay (ours, B's polling relay or C's Connect
worker) and a read_committed watcher, with each transaction's commit stamped on the monotonic
clock (bench/end_to_end.py drives it)."""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

import outbox
from bench import baseline_c
from bench.baselines import create_outbox_table, place_order_b
from bench.config import BenchConfig
from bench.connect_worker import ConnectWorker, DebeziumSettings
from bench.cpu import Roles, kafka_brokers, postgres_servers
from bench.procs import Child, Context, create_topic, holds_partitions, relay_env, unique
from bench.producer_path import outbox_settings
from bench.services import Services, engine_for
from bench.watch import Watcher
from bench.workload import CUSTOMER_KEYS, PAYLOAD, business_write, create_schema
from outbox import OutboxProducer, ensure_topics, migrations

_current = threading.local()


class Pipeline:
    """A database, one relay and a watcher for one implementation; transactions numbered."""

    def __init__(self, services: Services, ctx: Context, db: str, impl: str, config: BenchConfig):
        self.impl, self.db = impl, db
        self.ctx_logs = ctx.logs
        self.url = services.database(db, "e2e")
        migrations.upgrade(self.url)
        self.engine = engine_for(self.url, pool_size=config.e2e_workers)
        create_schema(self.engine)
        create_outbox_table(self.engine)
        self.topic = unique("bench-e2e")
        create_topic(services.bootstrap, self.topic)
        self.commits: dict[str, int] = {}
        self.factory = sessionmaker(self.engine)
        sa.event.listen(self.factory, "after_commit", self._committed)
        self._seqs = itertools.count(1)
        self.producer: OutboxProducer | None = None
        self.worker: ConnectWorker | None = None
        if impl == "baseline_c":
            baseline_c.create_outbox_table(self.engine)
            self.worker = ConnectWorker(
                services.harness,
                DebeziumSettings(
                    bootstrap=services.bootstrap,
                    db_url=self.url,
                    slot=unique("bench_e2e").replace("-", "_"),
                    poll_interval_ms=int(config.poll_interval_s * 1000),
                ),
            )
        elif impl == "ours":
            settings = outbox_settings(services.bootstrap, unique("__outbox-e2e"))
            ensure_topics(settings)
            self.producer = OutboxProducer(settings)
            group = unique("bench-e2e-relay")
            env = relay_env(services.bootstrap, settings.topic_prefix, group, "e2e")
            self.relay = Child(ctx, f"relay-{group}", "relay", env=env)
        else:
            args = [
                "relay",
                "--db-url",
                self.url,
                "--bootstrap",
                services.bootstrap,
                "--batch",
                str(config.b_batch),
                "--poll-interval",
                str(config.poll_interval_s),
            ]
            self.relay = Child(ctx, unique("polling-relay-e2e"), "bench.baselines", args)
        self.watcher = Watcher(
            ctx,
            unique("watch-e2e"),
            services.bootstrap,
            self.topic,
            consumer=dict(item.split("=", 1) for item in config.e2e_consumer),
        )
        places = {"baseline_b": self._baseline_b, "baseline_c": self._baseline_c}
        self.place = self._ours() if impl == "ours" else places[impl]

    def start(self) -> None:
        self.watcher.start()
        if self.worker is not None:
            self.worker.start()
            return
        self.relay.start()
        if self.impl == "ours":
            self.relay.wait_for_log(holds_partitions, 60, "partition assignment")

    def _committed(self, session: Session) -> None:
        seq = getattr(_current, "seq", None)
        if seq is not None:
            self.commits[seq] = time.monotonic_ns()

    def _ours(self) -> Any:
        assert self.producer is not None

        @outbox.transactional(producer=self.producer, session_factory=self.factory)
        def place_order(customer: int, seq: str, *, session: Session) -> None:
            business_write(session, customer)
            outbox.send(
                self.topic, PAYLOAD, key=CUSTOMER_KEYS[customer], headers={"bench-seq": seq}
            )

        return place_order

    def _baseline_b(self, customer: int, seq: str) -> None:
        place_order_b(self.factory, self.topic, customer, 1, {"bench-seq": seq})

    def _baseline_c(self, customer: int, seq: str) -> None:
        baseline_c.place_order_c(self.factory, self.topic, customer, 1, {"bench-seq": seq})

    def transaction(self, customer: int) -> str:
        seq = str(next(self._seqs))
        _current.seq = seq
        try:
            self.place(customer, seq)
        finally:
            _current.seq = None
        return seq

    def cpu_roles(self) -> Roles:
        """The processes of this pipeline's run, by role (SQLite runs inside the generator)."""

        def relay() -> list[int]:
            if self.worker is not None:
                pid = self.worker.pid()
                return [pid] if pid is not None else []
            proc = self.relay.proc
            return [proc.pid] if proc is not None and proc.poll() is None else []

        roles: dict[str, Callable[[], Iterable[int]]] = {
            "generator": lambda: [os.getpid()],
            "relay": relay,
            "broker": kafka_brokers,
        }
        if self.db == "postgresql":
            roles["database"] = postgres_servers
        return roles

    def close(self) -> None:
        if self.worker is not None:
            (self.ctx_logs / f"connect-{self.worker.settings.slot}.log").write_text(
                self.worker.logs()
            )
            self.worker.close()
        else:
            self.relay.stop()
        self.watcher.stop()
        if self.producer is not None:
            self.producer.close()
        self.engine.dispose()

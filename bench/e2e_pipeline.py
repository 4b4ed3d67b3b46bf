"""One end-to-end pipeline: a fresh database, one relay (ours, B's polling relay or C's Connect
worker), a read_committed watcher, and the generator processes that run the transactions and
stamp each commit on the monotonic clock (bench/generator.py; bench/end_to_end.py drives it)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from bench import baseline_c
from bench.baselines import create_outbox_table
from bench.config import BenchConfig
from bench.connect_worker import ConnectWorker, DebeziumSettings
from bench.cpu import Roles, kafka_brokers, postgres_servers
from bench.generator import GeneratorSpec, LoadGenerator
from bench.procs import Child, Context, create_topic, holds_partitions, relay_env, unique
from bench.producer_path import outbox_settings
from bench.services import Services, engine_for
from bench.watch import Watcher
from bench.workload import create_schema
from outbox import ensure_topics, migrations


class Pipeline:
    """A database, one relay, a watcher and the generator for one implementation."""

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
        prefix = unique("__outbox-e2e")
        if impl == "ours":
            settings = outbox_settings(services.bootstrap, prefix)
            ensure_topics(settings)
            group = unique("bench-e2e-relay")
            env = relay_env(services.bootstrap, settings.topic_prefix, group, "e2e")
            self.relay = Child(ctx, f"relay-{group}", "relay", env=env)
        elif impl == "baseline_b":
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
        self.engine.dispose()  # the set-up's; each generator process has its own
        self.generator = LoadGenerator(
            GeneratorSpec(
                impl=impl,
                url=self.url,
                topic=self.topic,
                bootstrap=services.bootstrap,
                topic_prefix=prefix,
                pool_size=max(1, config.e2e_workers // config.e2e_processes),
            ),
            config.e2e_processes,
        )

    def start(self) -> None:
        self.generator.start()
        self.watcher.start()
        if self.worker is not None:
            self.worker.start()
            return
        self.relay.start()
        if self.impl == "ours":
            self.relay.wait_for_log(holds_partitions, 60, "partition assignment")

    def cpu_roles(self) -> Roles:
        """The processes of this pipeline's run, by role (SQLite runs inside the generator's)."""

        def relay() -> list[int]:
            if self.worker is not None:
                pid = self.worker.pid()
                return [pid] if pid is not None else []
            proc = self.relay.proc
            return [proc.pid] if proc is not None and proc.poll() is None else []

        roles: dict[str, Callable[[], Iterable[int]]] = {
            "generator": lambda: [os.getpid(), *self.generator.pids()],
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
        self.generator.close()

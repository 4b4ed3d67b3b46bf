"""How long and how much: one object for the whole run, full or quick."""

from __future__ import annotations

from dataclasses import dataclass, replace

SCENARIOS = (
    "ceilings",
    "producer",
    "producer_async",
    "relay",
    "end_to_end",
    "checker",
    "audit",
)
#: What the producer, asyncio and relay paths and end to end can run (each runs those it has).
IMPLS = ("ours", "protocol_floor", "baseline_a", "baseline_b", "baseline_c")


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """Everything a run's length depends on.

    Attributes:
        quick: a smoke run (1 run, short durations, fewer configurations); its figures are
            not results.
        runs: timed runs per configuration, after one warm-up. Defaults to 3.
        seconds: length of one timed run of the time-boxed scenarios (producer path, end to end,
            pgbench). Defaults to 10 s.
        warmup_seconds: length of the warm-up of the time-boxed scenarios. Defaults to 3 s.
        scenarios: which to run, in this order. Defaults to all.
        databases: ``postgresql`` and/or ``sqlite``. Defaults to both.
        impls: which of ``ours``, ``protocol_floor``, ``baseline_a``, ``baseline_b``,
            ``baseline_c`` the producer path, relay path and end to end run (the floor,
            :mod:`bench.floor`, runs on the producer and asyncio paths only, one message per
            transaction; end to end never runs A, which has no relay; the producer path never
            runs C, whose producer side has B's shape; C runs on PostgreSQL only; the relay
            path always runs ours and B). Defaults to all.
        workers: producer-path thread counts. Defaults to 1, 4, 16.
        messages: producer-path messages per transaction. Defaults to 1, 10.
        relay_records: transactions preloaded for the relay path. Defaults to 100,000.
        loads: end-to-end offered loads, transactions/s. Defaults to 100, 400, 1,000, 5,000
            (400: about the highest both ours and baseline B sustain on 2 cores; issue 30
            compares their p99 at the highest load both sustain).
        e2e_workers: threads that run the end-to-end transactions, shared out among the
            generator processes. Defaults to 48.
        e2e_processes: end-to-end generator processes, each with its own engine and producer
            and an equal share of the offered rate (one interpreter cannot issue ours' 1,000
            txn/s). Defaults to 2.
        e2e_databases: end-to-end databases. Defaults to both.
        checker_txns: transactions left without an op for the checker. Defaults to 10,000.
        audit_txns: transactions the audit reads. Defaults to 1,000,000.
        kafka_records: records of Kafka's own perf tools. Defaults to 1,000,000.
        poll_interval_s: baseline B's polling interval. Defaults to 0.1 s.
        b_batch: baseline B's rows per relay batch. Defaults to 500.
        e2e_consumer: ``KEY=VALUE`` librdkafka settings of the end-to-end consumer (the same
            for ours and baseline B), over ``isolation.level=read_committed``. Defaults to
            ``fetch.wait.max.ms=10``, what docs/relay.md advises a latency-sensitive consumer:
            with librdkafka's 500 ms the broker may hold a read_committed fetch for that long
            after the records it waits for became committed, which measures the consumer's
            setting, not the path.
    """

    quick: bool = False
    runs: int = 3
    seconds: float = 10.0
    warmup_seconds: float = 3.0
    scenarios: tuple[str, ...] = SCENARIOS
    databases: tuple[str, ...] = ("postgresql", "sqlite")
    impls: tuple[str, ...] = IMPLS
    workers: tuple[int, ...] = (1, 4, 16)
    messages: tuple[int, ...] = (1, 10)
    relay_records: int = 100_000
    loads: tuple[int, ...] = (100, 400, 1_000, 5_000)
    e2e_workers: int = 48
    e2e_processes: int = 2
    e2e_databases: tuple[str, ...] = ("postgresql", "sqlite")
    checker_txns: int = 10_000
    audit_txns: int = 1_000_000
    kafka_records: int = 1_000_000
    poll_interval_s: float = 0.1
    b_batch: int = 500
    e2e_consumer: tuple[str, ...] = ("fetch.wait.max.ms=10",)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.scenarios) - set(SCENARIOS))
        if unknown:
            raise ValueError(f"unknown scenarios {unknown}; choose from {', '.join(SCENARIOS)}")
        for name, allowed in (
            ("databases", ("postgresql", "sqlite")),
            ("e2e_databases", ("postgresql", "sqlite")),
            ("impls", IMPLS),
        ):
            bad = sorted(set(getattr(self, name)) - set(allowed))
            if bad:
                raise ValueError(f"{name}: unknown {bad}; choose from {', '.join(allowed)}")
        if not 1 <= self.e2e_processes <= self.e2e_workers:
            raise ValueError(
                f"e2e_processes={self.e2e_processes!r} must be 1 to e2e_workers "
                f"({self.e2e_workers}): each process needs a worker"
            )
        if (
            "producer" in self.scenarios
            and set(self.impls) & {"ours", "baseline_a", "baseline_b"} == set()
            and "protocol_floor" in self.impls
            and 1 not in self.messages
        ):
            raise ValueError(
                f"the producer path would run nothing: impls {list(self.impls)} leave only "
                f"protocol_floor, which runs at 1 message per transaction, and messages is "
                f"{list(self.messages)}; add 1 to messages (--messages 1) or another impl"
            )
        if self.runs < 1 or self.seconds <= 0 or self.warmup_seconds < 0:
            raise ValueError("runs must be >= 1, seconds > 0 and warmup_seconds >= 0")

    @classmethod
    def quick_mode(cls, **overrides: object) -> BenchConfig:
        """A smoke run of every scenario: minutes, not an hour."""
        base = cls(
            quick=True,
            runs=1,
            seconds=3.0,
            warmup_seconds=1.0,
            workers=(1, 16),
            messages=(1, 10),
            relay_records=10_000,
            loads=(100, 1_000),
            e2e_databases=("postgresql",),
            checker_txns=2_000,
            audit_txns=20_000,
            kafka_records=100_000,
        )
        return replace(base, **overrides)  # type: ignore[arg-type]

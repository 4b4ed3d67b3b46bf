"""Relays as child processes, and load for the relay's failure tests: transactions written
straight onto the internal topics (as producers and checkers write them), and a read_committed
consumer watching the real topic.

The generator keeps the ground truth: which transactions committed, and in which order each
key's COMMIT ops were written (the order the relay must keep).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer

from outbox import OutboxSettings, ensure_topics
from outbox.protocol import (
    DecidedBy,
    HalfMessage,
    Header,
    OpRecord,
    OpState,
    encode_half_headers,
    encode_op,
    new_transaction_id,
    partition_for,
)
from outbox.testing.ports import free_port
from tests.kafka_helpers import create_topic, unique
from tests.supervision import restart_when_stuck, stacks

PARTITIONS = 6
GRACE_S = 5
ROOT = Path(__file__).parents[2]


class Load:
    """Writes batches of transactions in a background thread until ``stop()``."""

    def __init__(
        self,
        bootstrap: str,
        prefix: str,
        *,
        keys: int = 20,
        batch: int = 40,
        pause_s: float = 0.05,
        seed: int = 7,
    ) -> None:
        self.settings = OutboxSettings(
            bootstrap_servers=bootstrap,
            producer_group="load",
            topic_prefix=prefix,
            partitions=PARTITIONS,
        )
        ensure_topics(self.settings)
        self.real_topic = unique("relayed")
        create_topic(bootstrap, self.real_topic, partitions=3)
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 5,
                "enable.idempotence": True,
                "acks": "all",
                # broker restarts: keep retrying rather than dropping records
                "message.timeout.ms": 120_000,
            }
        )
        self.keys = [f"key-{i}".encode() for i in range(keys)]
        self.batch, self.pause_s = batch, pause_s
        self.rng = random.Random(seed)
        self.committed: dict[str, int] = {}
        self.rolled_back: set[str] = set()
        self.commit_order: dict[bytes, list[str]] = defaultdict(list)
        self.errors: list[str] = []
        self._failed_ops: list[tuple[bytes, bytes, int]] = []
        self.resent_ops = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(180)
        assert not self._thread.is_alive()
        assert not self.errors, self.errors[:3]

    def _run(self) -> None:
        while not self._stop.is_set():
            self.write_batch()
            time.sleep(self.pause_s)

    def write_batch(self) -> None:
        """Halves first (acknowledged), then the ops, as a producer does; some ops twice."""
        plan = []
        for _ in range(self.batch):
            key = self.rng.choice(self.keys)
            count = self.rng.randint(1, 3)
            state = OpState.ROLLBACK if self.rng.random() < 0.1 else OpState.COMMIT
            plan.append((new_transaction_id(), key, count, state))
        offsets: dict[str, list[int]] = defaultdict(list)
        for txn_id, key, count, _ in plan:
            partition = partition_for(key, PARTITIONS)
            for index in range(count):
                message = HalfMessage(self.real_topic, f"{txn_id}/{index}".encode(), key)
                self.producer.produce(
                    self.settings.topics.half,
                    key=txn_id.encode(),
                    value=message.value,
                    headers=encode_half_headers(
                        txn_id=txn_id,
                        producer_group="load",
                        message=message,
                        index=index,
                        count=count,
                        created_at_ms=int(time.time() * 1000),
                    ),
                    partition=partition,
                    on_delivery=self._delivered(offsets, txn_id),
                )
        self._flush()
        for txn_id, key, count, state in plan:
            if len(offsets[txn_id]) != count:
                continue  # never acknowledged: a producer would not run the transaction
            op = OpRecord(
                txn_id,
                state,
                "load",
                partition_for(key, PARTITIONS),
                tuple(sorted(offsets[txn_id])),
                DecidedBy.PRODUCER,
                int(time.time() * 1000),
            )
            k, v = encode_op(op)
            copies = 2 if self.rng.random() < 0.03 else 1  # a producer and a checker racing
            for _ in range(copies):
                self._send_op(k, v, op.half_partition)
            if state is OpState.COMMIT:
                self.committed[txn_id] = count
                self.commit_order[key].append(txn_id)
            else:
                self.rolled_back.add(txn_id)
        self._flush()
        while self._failed_ops:  # the decision is made: re-send it, as the checker would
            failed, self._failed_ops = self._failed_ops, []
            self.resent_ops += len(failed)
            for k, v, partition in failed:
                self._send_op(k, v, partition)
            self._flush()

    def _send_op(self, key: bytes, value: bytes, partition: int) -> None:
        def on_delivery(err: KafkaError | None, _msg: object) -> None:
            if err is not None:
                self._failed_ops.append((key, value, partition))

        self.producer.produce(
            self.settings.topics.op,
            key=key,
            value=value,
            partition=partition,
            on_delivery=on_delivery,
        )

    def _delivered(self, offsets: dict[str, list[int]], txn_id: str):  # type: ignore[no-untyped-def]
        def on_delivery(err: KafkaError | None, msg: object) -> None:
            if err is None:
                offsets[txn_id].append(msg.offset())  # type: ignore[attr-defined]

        return on_delivery

    def _flush(self) -> None:
        left = self.producer.flush(150)
        if left:
            self.errors.append(f"{left} records not acknowledged")

    def expected(self) -> set[tuple[str, int]]:
        return {(t, i) for t, n in list(self.committed.items()) for i in range(n)}


class Watcher:
    """A read_committed consumer of the real topic, reading while the relays run."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.seen: Counter[tuple[str, int]] = Counter()
        self.per_key: dict[bytes, list[str]] = defaultdict(list)
        #: (partition, offset) each message was read at: a repeat at the same offset is a
        #: re-read by this consumer, at another offset a second copy in the topic.
        self.where: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
        #: Records read a second time at the same (partition, offset), not counted again.
        self.reread = 0
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": unique("watcher"),
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        self._consumer.subscribe([topic])
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="watcher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for msg in self._consumer.consume(500, 0.2):
                if msg.error() is None:
                    self.record(msg)
        self._consumer.close()

    def record(self, msg: object) -> None:
        headers = dict(msg.headers())  # type: ignore[attr-defined]
        txn = headers[Header.TXN_ID].decode()
        at = (msg.partition(), msg.offset())  # type: ignore[attr-defined]
        with self._lock:
            message = (txn, int(headers[Header.MESSAGE_INDEX]))
            if at in self.where[message]:
                # This consumer read the same record again (e.g. its group, which commits no
                # offsets, rejoined after a broker restart and started over from the earliest):
                # not a second copy in the topic, which would sit at another offset.
                self.reread += 1
                return
            self.seen[message] += 1
            self.where[message].append(at)
            order = self.per_key[msg.key()]  # type: ignore[attr-defined]
            if not order or order[-1] != txn:
                order.append(txn)

    def count(self) -> int:
        with self._lock:
            return len(self.seen)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def check_exactly_once(load: Load, seen: Counter[tuple[str, int]], per_key: dict) -> None:
    """Output set == committed set, each once; nothing rolled back; per-key COMMIT order."""
    assert set(seen) == load.expected(), (
        f"missing {len(load.expected() - set(seen))}, phantom {len(set(seen) - load.expected())}"
    )
    repeated = {k: n for k, n in seen.items() if n > 1}
    assert not repeated, f"{len(repeated)} messages delivered more than once"
    assert not {t for t, _ in seen} & load.rolled_back
    for key, txns in load.commit_order.items():
        assert per_key[key] == txns, f"order of {key!r} differs"


class RelayProcess:
    """``python -m relay`` as a child process, configured through its environment."""

    def __init__(
        self,
        bootstrap: str,
        prefix: str,
        group: str,
        name: str,
        logs: Path,
        **settings: object,
    ) -> None:
        self.name = name
        self.log = logs / f"{name}.log"
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "OUTBOX_RELAY_BOOTSTRAP_SERVERS": bootstrap,
            "OUTBOX_RELAY_TOPIC_PREFIX": prefix,
            "OUTBOX_RELAY_GROUP_ID": group,
            "OUTBOX_RELAY_INSTANCE_ID": name,
            "OUTBOX_RELAY_SHUTDOWN_GRACE_S": str(GRACE_S),
            "OUTBOX_RELAY_KAFKA__SESSION_TIMEOUT_MS": "6000",
            "OUTBOX_RELAY_HTTP_PORT": str(free_port()),
            **{f"OUTBOX_RELAY_{k.upper()}": str(v) for k, v in settings.items()},
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.stuck_exits = 0
        self.stopping = False
        self.started_at = 0

    def start(self) -> None:
        self.started_at = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "relay"], env=self.env, stdout=out, stderr=subprocess.STDOUT
            )

    def supervise(self) -> None:
        """Start it again whenever it gives up stuck (exit 3), as a deployment's supervisor
        (Kubernetes, compose's restart policy, systemd) would. Call before ``start()``."""
        self.env["OUTBOX_RELAY_STUCK_EXIT_S"] = "60"
        restart_when_stuck(self, self.name)

    def holds_partitions(self) -> bool:
        """Its log says, since its last start, that it was assigned at least one partition."""
        text = self.log.read_bytes()[self.started_at :].decode(errors="replace")
        return any(
            "assigned partitions [" in line and "assigned partitions []" not in line
            for line in text.splitlines()
        )

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def terminate(self) -> float:
        """SIGTERM; returns how long the clean exit took (it must exit 0)."""
        assert self.proc is not None
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(GRACE_S + 20)
        assert code == 0, f"{self.name} exited {code}:\n{self.tail()}"
        return time.monotonic() - started

    def stacks(self) -> str:
        """Every thread's stack (SIGUSR1 makes the relay write them to its log)."""
        return stacks(self.proc, self.log)

    def metrics(self) -> str:
        """Its gauges and counters (no histograms), for a failure report; empty if down."""
        port = self.env["OUTBOX_RELAY_HTTP_PORT"]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError as err:
            return f"(no metrics: {err})"
        keep = ("lag", "pending", "parked", "aborts", "dead_lettered", "promoted_total", "held")
        return "\n".join(
            line
            for line in text.splitlines()
            if line.startswith("outbox_relay_") and any(k in line for k in keep)
        )

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])

    def stop(self) -> None:
        self.stopping = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(GRACE_S + 20)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)

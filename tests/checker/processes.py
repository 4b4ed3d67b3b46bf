"""Checkers as child processes (``python -m checker``), and transactions written in bulk straight
onto the internal topics, as producers and earlier checkers write them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from confluent_kafka import Producer

from outbox.protocol import (
    DecidedBy,
    HalfMessage,
    OpRecord,
    OpState,
    encode_half_headers,
    encode_op,
    new_transaction_id,
)
from outbox.protocol.partitioning import partition_for
from outbox.protocol.topics import TopicNames
from outbox.testing.ports import free_port
from tests.checker.test_checker import SECRET
from tests.supervision import restart_when_stuck, stacks

ROOT = Path(__file__).parents[2]


class CheckerProcess:
    """``python -m checker`` configured through its environment; its HTTP port serves
    ``/readyz`` and ``/metrics``."""

    def __init__(
        self, bootstrap: str, prefix: str, group: str, name: str, log: Path, **settings: object
    ) -> None:
        self.log = log
        self.port = free_port()
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "OUTBOX_CHECKER_BOOTSTRAP_SERVERS": bootstrap,
            "OUTBOX_CHECKER_TOPIC_PREFIX": prefix,
            "OUTBOX_CHECKER_GROUP_ID": group,
            "OUTBOX_CHECKER_INSTANCE_ID": name,
            "OUTBOX_CHECK_SECRET": SECRET,
            "OUTBOX_CHECKER_TRANSACTION_TIMEOUT_S": "1",
            "OUTBOX_CHECKER_CHECK_INTERVAL_S": "1",
            "OUTBOX_CHECKER_HTTP_PORT": str(self.port),
            "OUTBOX_CHECKER_HTTP_HOST": "127.0.0.1",
            **{f"OUTBOX_CHECKER_{k.upper()}": str(v) for k, v in settings.items()},
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopping = False
        self.stuck_exits = 0

    def start(self) -> CheckerProcess:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "checker"],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()
        except OSError as err:
            return 0, str(err)

    def metric(self, name: str) -> float | None:
        status, text = self.get("/metrics")
        for line in text.splitlines() if status == 200 else []:
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None

    def peak_rss_kib(self) -> int:
        """The process's peak resident set (VmHWM), in KiB."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        raise AssertionError("no VmHWM")

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def supervise(self, name: str) -> None:
        """Start it again whenever it gives up stuck (exit 3), as a deployment's supervisor
        would. Call before ``start()``."""
        self.env["OUTBOX_CHECKER_STUCK_EXIT_S"] = "60"
        restart_when_stuck(self, name)

    def metrics(self) -> str:
        """Its ``outbox_checker_*`` metrics, for a failure report; what went wrong if down."""
        status, text = self.get("/metrics")
        if status != 200:
            return f"(no metrics: {status} {text})"
        return "\n".join(line for line in text.splitlines() if line.startswith("outbox_checker_"))

    def stacks(self) -> str:
        """Every thread's stack (SIGUSR1 makes the checker write them to its log)."""
        return stacks(self.proc, self.log)

    def stop(self) -> None:
        self.stopping = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def tail(self) -> str:
        lines = self.log.read_text(errors="replace").splitlines()
        return "\n".join(line for line in lines if not line.startswith("%"))[-4000:]


def write_transactions(
    bootstrap: str,
    names: TopicNames,
    count: int,
    *,
    partitions: int,
    group: str,
    decided: bool,
    topic: str = "orders",
) -> list[str]:
    """``count`` one-message transactions of ``group``: a half record each, and its COMMIT op
    when ``decided``; returns their ids. Written fast (batched), as a busy service would."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10000}
    )
    ids = []
    now_ms = int(time.time() * 1000)
    for i in range(count):
        txn_id = new_transaction_id()
        key = f"key-{i % 1000}".encode()
        partition = partition_for(key, partitions)
        message = HalfMessage(topic, b"v", key)
        headers = encode_half_headers(
            txn_id=txn_id,
            producer_group=group,
            message=message,
            index=0,
            count=1,
            created_at_ms=now_ms,
        )
        _produce(producer, names.half, txn_id.encode(), b"v", partition, headers)
        if decided:
            op = OpRecord(
                txn_id, OpState.COMMIT, group, partition, (0,), DecidedBy.PRODUCER, now_ms
            )
            op_key, op_value = encode_op(op)  # offsets: not read by the checker
            _produce(producer, names.op, op_key, op_value, partition, None)
        ids.append(txn_id)
    assert producer.flush(120) == 0
    return ids


def _produce(
    producer: Producer, topic: str, key: bytes, value: bytes, partition: int, headers: object
) -> None:
    while True:
        try:
            producer.produce(topic, value, key, partition, headers=headers)
            return
        except BufferError:
            producer.poll(0.1)

"""A ``read_committed`` consumer in its own process, stamping when each record became visible.

``python -m bench.watch --bootstrap HOST:PORT --topic T --mode real|op --out FILE`` reads every
partition of ``T`` from the beginning. It prints ``n <count>`` to stdout every 100 ms; on
SIGUSR1 it writes what it saw so far to ``FILE.snap`` and prints ``snap``; on SIGTERM it writes
everything to ``FILE`` (JSON). Arrival times are ``time.monotonic_ns()``, the
machine-wide monotonic clock (Linux ``CLOCK_MONOTONIC``), so they compare with the benchmark
process's own timestamps. A separate process keeps the benchmark's threads from delaying the
stamps, and it reads with :func:`outbox.reading.consume_ready`: ``consume(2000, 0.05)``, as it
did before, returned at the end of its 50 ms unless 2,000 records came, and stamped every record
of a light load up to 50 ms late (25 ms on average), whichever design delivered it.

Modes: ``real`` records each promoted record's ``bench-seq`` header (else its
``outbox-txn-id``); ``op`` records the ops a checker wrote (``decided_by`` = checker), tagged
with the transaction id and the state.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from bench.procs import Child, Context
from outbox.reading import consume_ready

SEQ_HEADER = "bench-seq"
TXN_HEADER = "outbox-txn-id"


@dataclass
class Arrivals:
    """What a watcher saw: one entry per record, in arrival order."""

    tags: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    arrival_ns: list[int] = field(default_factory=list)
    broker_ms: list[int] = field(default_factory=list)

    def first_arrival(self) -> dict[str, int]:
        """Tag -> when it was first seen (a repeat does not move it)."""
        return self._first(self.arrival_ns)

    def first_timestamp(self) -> dict[str, int]:
        """Tag -> the record's own timestamp (ms, wall clock) where it was first seen: for a
        promoted record, when the relay produced it."""
        return self._first(self.broker_ms)

    def _first(self, values: list[int]) -> dict[str, int]:
        first: dict[str, int] = {}
        for tag, value in zip(self.tags, values, strict=True):
            first.setdefault(tag, value)
        return first

    @property
    def duplicates(self) -> int:
        return len(self.tags) - len(set(self.tags))


def _tag(mode: str, headers: Any, value: bytes | None) -> tuple[str, str] | None:
    if mode == "op":
        if value is None:
            return None
        op = json.loads(value)
        if op.get("decided_by") != "checker":
            return None
        return str(op["txn_id"]), str(op["state"])
    found = dict(headers or [])
    tag = found.get(SEQ_HEADER) or found.get(TXN_HEADER) or b""
    return tag.decode(), "promoted"


def watch(bootstrap: str, topic: str, mode: str, out: Path, extra: dict[str, str]) -> None:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-watch-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            **extra,
        }
    )
    partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    stop, snap = threading.Event(), threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    def on_snapshot(signum: int, frame: FrameType | None) -> None:
        snap.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGUSR1, on_snapshot)
    snapshot = out.with_suffix(".snap")
    seen = Arrivals()
    print("ready", flush=True)
    reported = time.monotonic()
    while not stop.is_set():
        batch = consume_ready(consumer, 2000, 0.05)  # consume() would stamp late
        now = time.monotonic_ns()
        for msg in batch:
            if msg.error() is not None:
                continue
            tagged = _tag(mode, msg.headers(), msg.value())
            if tagged is not None:
                seen.tags.append(tagged[0])
                seen.kinds.append(tagged[1])
                seen.arrival_ns.append(now)
                seen.broker_ms.append(msg.timestamp()[1])
        if time.monotonic() - reported > 0.1:
            print(f"n {len(seen.tags)}", flush=True)
            reported = time.monotonic()
        if snap.is_set():
            snap.clear()
            snapshot.with_suffix(".tmp").write_text(json.dumps(seen.__dict__))
            snapshot.with_suffix(".tmp").replace(snapshot)
            print("snap", flush=True)
    consumer.close()
    out.write_text(json.dumps(seen.__dict__))
    print("done", flush=True)


class Watcher:
    """The parent's handle on a watcher process: its running count, then what it saw."""

    def __init__(
        self,
        ctx: Context,
        name: str,
        bootstrap: str,
        topic: str,
        mode: str = "real",
        consumer: dict[str, str] | None = None,
    ):
        self.out = ctx.logs / f"{name}.json"
        args = ["--bootstrap", bootstrap, "--topic", topic, "--mode", mode, "--out", str(self.out)]
        for key, value in (consumer or {}).items():
            args += ["--consumer", f"{key}={value}"]
        self.child = Child(ctx, name, "bench.watch", args, profiled=False)
        self.count = 0
        self._ready = threading.Event()
        self._snapped = threading.Event()
        self._reader: threading.Thread | None = None

    def start(self, timeout: float = 60.0) -> Watcher:
        self.child.start(stdout=subprocess.PIPE)
        assert self.child.proc is not None and self.child.proc.stdout is not None
        self._reader = threading.Thread(
            target=self._read, args=(self.child.proc.stdout,), daemon=True
        )
        self._reader.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"watcher {self.child.name} not ready:\n{self.child.tail()}")
        return self

    def _read(self, stream: IO[bytes]) -> None:
        for raw in stream:
            line = raw.decode().strip()
            if line == "ready":
                self._ready.set()
            elif line.startswith("n "):
                self.count = int(line[2:])
            elif line == "snap":
                self._snapped.set()

    def snapshot(self, timeout: float = 60.0) -> Arrivals:
        """What the watcher has seen so far (it keeps watching)."""
        assert self.child.proc is not None
        self._snapped.clear()
        self.child.proc.send_signal(signal.SIGUSR1)
        if not self._snapped.wait(timeout):
            raise RuntimeError(f"watcher {self.child.name} wrote no snapshot:\n{self.child.tail()}")
        path = self.out.with_suffix(".snap")
        data = json.loads(path.read_text())
        path.unlink()  # scratch, like the final file: a run's logs keep the watcher's log only
        return Arrivals(**data)

    def wait_for(self, count: int, timeout: float, stalled_after: float = 60.0) -> bool:
        """Until ``count`` records were seen; False when the time ran out or nothing arrived
        for ``stalled_after`` seconds."""
        deadline = time.monotonic() + timeout
        last, last_change = self.count, time.monotonic()
        while self.count < count:
            now = time.monotonic()
            if self.count != last:
                last, last_change = self.count, now
            if now > deadline or now - last_change > stalled_after or not self.child.alive():
                return False
            time.sleep(0.05)
        return True

    def stop(self) -> Arrivals:
        self.child.stop(30)
        if self._reader is not None:
            self._reader.join(10)
        if not self.out.exists():
            raise RuntimeError(f"watcher {self.child.name} wrote nothing:\n{self.child.tail()}")
        data = json.loads(self.out.read_text())
        self.out.unlink()
        return Arrivals(**data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.watch")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--mode", choices=["real", "op"], default="real")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument(
        "--consumer", action="append", default=[], metavar="KEY=VALUE", help="librdkafka setting"
    )
    args = parser.parse_args(argv)
    extra = dict(item.split("=", 1) for item in args.consumer)
    watch(args.bootstrap, args.topic, args.mode, args.out, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())

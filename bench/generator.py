"""The end-to-end load generator: an open-loop schedule run by several processes.

One Python process cannot issue ours' transactions faster than its one interpreter runs the
producer library (about 700-800 a second on this machine's cores): at 1,000 txn/s offered, a
single generator measured itself, not the pipeline. Each generator process here holds its own
engine and, for ours, its own ``OutboxProducer`` - as the processes of a service's deployment
do - and runs ``rate / processes`` transactions a second from ``workers / processes`` threads.

Commits are stamped on the monotonic clock (``CLOCK_MONOTONIC``, one clock for every process of
the machine), so the watcher's arrival stamps, taken in yet another process, subtract from them.
Processes are spawned, not forked: a fork would copy librdkafka's and the pool's threads' state.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

#: How long a generator process may take to import and connect before it is given up.
START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class GeneratorSpec:
    """What a generator process needs to build its side of a pipeline (picklable)."""

    impl: str
    url: str
    topic: str
    bootstrap: str
    topic_prefix: str
    pool_size: int


@dataclass
class LoadRun:
    """What one timed run of the whole generator committed, and how fast."""

    committed: list[str]
    commits: dict[str, int]
    errors: list[str]
    elapsed: float
    shed: int


def open_loop(
    transaction: Callable[[int], str], rate: float, seconds: float, workers: int, seed: int = 0
) -> dict[str, Any]:
    """Issue ``rate`` transactions/s for ``seconds`` from ``workers`` threads; what was committed.

    The schedule is kept in time: when every worker is busy, the scheduler waits for one, and
    what could not be issued by the end of the window is not issued at all (``shed``), so a
    run lasts ``seconds`` (plus the transactions in flight) whatever the system sustains.
    """
    total = max(1, int(rate * seconds))
    slots = threading.Semaphore(workers)
    rng = random.Random(int(rate) * 100 + seed)
    committed: list[str] = []
    errors: list[str] = []
    lock = threading.Lock()

    def task(customer: int) -> None:
        try:
            seq = transaction(customer)
            with lock:
                committed.append(seq)
        except Exception as err:
            with lock:
                errors.append(repr(err))
        finally:
            slots.release()

    pool = ThreadPoolExecutor(workers, thread_name_prefix="bench-e2e")
    start = time.perf_counter()
    end = start + seconds
    issued = 0
    while issued < total and time.perf_counter() < end:
        due = min(total, int((time.perf_counter() - start) * rate) + 1)
        while issued < due:
            if not slots.acquire(timeout=max(0.0, end - time.perf_counter())):
                break
            pool.submit(task, rng.randint(1, 100))
            issued += 1
        delay = start + issued / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
    pool.shutdown(wait=True)
    elapsed = time.perf_counter() - start
    return {"committed": committed, "errors": errors, "elapsed": elapsed, "shed": total - issued}


class _Side:
    """One process's side of the pipeline: its engine, its producer, its numbered transactions."""

    def __init__(self, spec: GeneratorSpec, index: int) -> None:
        from bench.producer_path import outbox_settings
        from bench.services import engine_for
        from outbox import OutboxProducer

        self.spec = spec
        self.engine = engine_for(spec.url, pool_size=spec.pool_size)
        with self.engine.connect():  # ready means the database answers
            pass
        self.factory = sessionmaker(self.engine)
        self.commits: dict[str, int] = {}
        self._current = threading.local()
        sa.event.listen(self.factory, "after_commit", self._committed)
        self._seqs = (f"{index}.{n}" for n in itertools.count(1))
        self.producer = (
            OutboxProducer(outbox_settings(spec.bootstrap, spec.topic_prefix))
            if spec.impl == "ours"
            else None
        )
        self.place = self._place()

    def _committed(self, session: Session) -> None:
        seq = getattr(self._current, "seq", None)
        if seq is not None:
            self.commits[seq] = time.monotonic_ns()

    def _place(self) -> Callable[[int, str], None]:
        from bench import baseline_c
        from bench.baselines import place_order_b

        topic, factory = self.spec.topic, self.factory
        if self.spec.impl == "baseline_b":
            return lambda customer, seq: place_order_b(
                factory, topic, customer, 1, {"bench-seq": seq}
            )
        if self.spec.impl == "baseline_c":
            return lambda customer, seq: baseline_c.place_order_c(
                factory, topic, customer, 1, {"bench-seq": seq}
            )
        import outbox
        from bench.workload import CUSTOMER_KEYS, PAYLOAD, business_write

        @outbox.transactional(producer=self.producer, session_factory=factory)
        def place_order(customer: int, seq: str, *, session: Session) -> None:
            business_write(session, customer)
            outbox.send(topic, PAYLOAD, key=CUSTOMER_KEYS[customer], headers={"bench-seq": seq})

        return place_order  # type: ignore[return-value]  # session is the decorator's

    def transaction(self, customer: int) -> str:
        seq = next(self._seqs)
        self._current.seq = seq
        try:
            self.place(customer, seq)
        finally:
            self._current.seq = None
        return seq

    def run(self, rate: float, seconds: float, workers: int, seed: int) -> dict[str, Any]:
        load = open_loop(self.transaction, rate, seconds, workers, seed)
        load["commits"] = {s: self.commits.pop(s) for s in load["committed"] if s in self.commits}
        self.commits.clear()
        return load

    def close(self) -> None:
        if self.producer is not None:
            self.producer.close()
        self.engine.dispose()


def _serve(spec: GeneratorSpec, index: int, conn: Connection) -> None:
    """A generator process: build its side, then run what the parent asks until told to stop."""
    try:
        side = _Side(spec, index)
    except BaseException as err:
        conn.send(("failed", repr(err)))
        raise
    conn.send(("ready", None))
    try:
        while True:
            command, args = conn.recv()
            if command == "stop":
                break
            conn.send(("done", side.run(*args)))
    finally:
        side.close()


class LoadGenerator:
    """``processes`` generator processes sharing one offered rate and one worker budget.

    The processes are spawned, so a script that starts one runs its own code under
    ``if __name__ == "__main__":`` (a spawned process imports the main module again).
    """

    def __init__(self, spec: GeneratorSpec, processes: int) -> None:
        if processes < 1:
            raise ValueError(f"processes={processes!r} must be at least 1")
        self.spec, self.processes = spec, processes
        self._ctx = multiprocessing.get_context("spawn")
        self._procs: list[Any] = []
        self._conns: list[Connection] = []

    def start(self) -> None:
        """One process after the other, each ready before the next starts: on SQLite the first
        connection switches the file to WAL, which takes an exclusive lock that a second process
        connecting at the same moment met as "database is locked" (its busy timeout not asked)."""
        for index in range(self.processes):
            parent, child = self._ctx.Pipe()
            proc = self._ctx.Process(
                target=_serve, args=(self.spec, index, child), name=f"bench-generator-{index}"
            )
            proc.start()
            child.close()
            self._procs.append(proc)
            self._conns.append(parent)
            self._ready(index, parent)

    def _ready(self, index: int, conn: Connection) -> None:
        if not conn.poll(START_TIMEOUT_S):
            raise RuntimeError(f"generator process {index} not ready in {START_TIMEOUT_S} s")
        status, detail = conn.recv()
        if status != "ready":
            raise RuntimeError(f"generator process {index} failed to start: {detail}")

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.pid is not None and p.is_alive()]

    def run(self, rate: float, seconds: float, workers: int) -> LoadRun:
        """One timed run: every process offers its share of ``rate`` at once."""
        share_workers = max(1, workers // self.processes)
        for index, conn in enumerate(self._conns):
            conn.send(("run", (rate / self.processes, seconds, share_workers, index)))
        merged = LoadRun([], {}, [], 0.0, 0)
        for index, conn in enumerate(self._conns):
            if not conn.poll(seconds + 300):
                raise RuntimeError(f"generator process {index} did not finish its run")
            _, load = conn.recv()
            merged.committed.extend(load["committed"])
            merged.commits.update(load["commits"])
            merged.errors.extend(load["errors"])
            merged.elapsed = max(merged.elapsed, load["elapsed"])
            merged.shed += load["shed"]
        return merged

    def close(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError):  # a process that died has closed its end
                conn.send(("stop", None))
        for proc in self._procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        for conn in self._conns:
            conn.close()
        self._procs.clear()
        self._conns.clear()

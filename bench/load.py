"""Closed-loop load: N threads, each running transactions back to back for a fixed time.

The latency of a transaction is measured around the whole call (for ours: the decorated
function, i.e. half send acknowledged, evidence row, DB commit and op), on the calling thread.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.stats import percentiles

#: One transaction: (customer) -> None.
Transaction = Callable[[int], None]


@dataclass
class LoadResult:
    completed: int
    errors: int
    elapsed_s: float
    latencies_ms: list[float]
    first_error: str | None = None
    profiles: list[Any] = field(default_factory=list)

    def figures(self) -> dict[str, float]:
        p50, p99 = percentiles(self.latencies_ms, (50, 99))
        return {
            "txn_per_s": self.completed / self.elapsed_s if self.elapsed_s else float("nan"),
            "p50_ms": p50,
            "p99_ms": p99,
            "errors": float(self.errors),
        }


def closed_loop(
    txn: Transaction, *, workers: int, seconds: float, seed: int = 1, profile: bool = False
) -> LoadResult:
    """Run ``txn`` from ``workers`` threads for ``seconds``; every completion counted.

    With ``profile`` each worker thread runs under its own pyinstrument profiler; the sessions
    come back in ``profiles``.
    """
    start_gate = threading.Barrier(workers + 1)
    lock = threading.Lock()
    result = LoadResult(0, 0, 0.0, [])
    deadline = [0.0]

    def worker(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        latencies: list[float] = []
        errors, first_error = 0, None
        profiler = _profiler() if profile else None
        start_gate.wait()
        if profiler is not None:
            profiler.start()
        while time.perf_counter() < deadline[0]:
            customer = rng.randint(1, 100)
            began = time.perf_counter()
            try:
                txn(customer)
            except Exception as err:
                errors += 1
                first_error = first_error or repr(err)
                continue
            latencies.append((time.perf_counter() - began) * 1000)
        with lock:
            result.latencies_ms.extend(latencies)
            result.completed += len(latencies)
            result.errors += errors
            result.first_error = result.first_error or first_error
            if profiler is not None:
                result.profiles.append(profiler.stop())

    threads = [
        threading.Thread(target=worker, args=(i,), name=f"bench-worker-{i}", daemon=True)
        for i in range(workers)
    ]
    for thread in threads:
        thread.start()
    began = time.perf_counter()
    deadline[0] = began + seconds
    start_gate.wait()
    for thread in threads:
        thread.join()
    result.elapsed_s = time.perf_counter() - began
    return result


def _profiler() -> Any:
    from pyinstrument import Profiler

    return Profiler(interval=0.001, async_mode="disabled")

"""Two checkouts' relays, each draining an equal preloaded backlog at the same time on one broker.

On a shared machine a relay's rate varies several-fold within the hour, so runs one after
another cannot show a change of a few percent; two relays running side by side meet the same
contention. Per round: each relay's promotions/s (first to last record visible to a
``read_committed`` reader) and its process CPU per promotion over the same span; the medians and
the per-round ratios second/first are printed. Each relay runs ``python -m relay`` from its own
tree (working directory and ``PYTHONPATH``), so any two checkouts (``git archive`` of a commit)
compare::

    PYTHONPATH=. python -m bench.relay_side_by_side --count 100000 --rounds 5 \\
        old=/tmp/relay-old new=.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import preload
from bench.drain import rates
from bench.procs import Context, create_topic, relay_env, unique
from bench.services import start_services
from bench.watch import Watcher
from outbox.testing.ports import free_port


def cpu_s(pid: int) -> float:
    """A process's user + system CPU so far, all threads, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Run:
    """One relay of a round: its backlog, its reader and its process."""

    name: str
    tree: str
    watcher: Watcher
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    #: CPU when the first record became visible, and when the last did.
    cpu: list[float] = field(default_factory=list)


def prepare(ctx: Context, bootstrap: str, name: str, tree: str, count: int) -> Run:
    prefix, group, topic = unique("__outbox-sbs"), unique("sbs-relay"), unique("sbs-relayed")
    create_topic(bootstrap, topic)
    stream = preload.writer(bootstrap, prefix)
    preload.write_transactions(stream, topic, count)
    stream.close()
    env = relay_env(bootstrap, prefix, group, "r0", http_port=free_port(), http_host="127.0.0.1")
    watcher = Watcher(ctx, unique(f"watch-{name}"), bootstrap, topic).start()
    return Run(name, tree, watcher, {**os.environ, "PYTHONPATH": tree, **env})


def one_round(ctx: Context, bootstrap: str, trees: dict[str, str], count: int) -> dict[str, Any]:
    runs = [prepare(ctx, bootstrap, name, tree, count) for name, tree in trees.items()]
    started = time.monotonic_ns()
    for run in runs:
        with (ctx.logs / f"relay-{run.name}-{started}.log").open("ab") as log:
            run.proc = subprocess.Popen(
                [sys.executable, "-m", "relay"], env=run.env, cwd=run.tree, stdout=log, stderr=log
            )
    deadline = time.monotonic() + 120 + count / 300
    try:
        while time.monotonic() < deadline and any(len(r.cpu) < 2 for r in runs):
            for run in runs:
                assert run.proc is not None
                seen = run.watcher.count
                if (not run.cpu and seen > 0) or (len(run.cpu) == 1 and seen >= count):
                    run.cpu.append(cpu_s(run.proc.pid))
            time.sleep(0.02)
    finally:
        for run in runs:
            if run.proc is not None:
                run.proc.terminate()
        for run in runs:
            if run.proc is not None:
                try:
                    run.proc.wait(30)
                except subprocess.TimeoutExpired:
                    run.proc.kill()
                    run.proc.wait()
    out = {}
    for run in runs:
        figures = rates(run.watcher.stop(), count, started)
        spent = run.cpu[1] - run.cpu[0] if len(run.cpu) == 2 else float("nan")
        figures["cpu_us_per_promotion"] = spent / count * 1e6
        out[run.name] = figures
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000, help="transactions per backlog")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("trees", nargs=2, metavar="NAME=TREE", help="two checkouts")
    args = parser.parse_args()
    trees = dict(t.split("=", 1) for t in args.trees)
    names = list(trees)
    services = start_services(postgres=False)
    ctx = Context(Path("bench/results") / f"side-by-side-{time.strftime('%Y%m%dT%H%M%S')}")
    rounds = []
    try:
        one_round(ctx, services.bootstrap, trees, 5000)  # warm-up: topics, group coordinator
        for i in range(args.rounds):
            order = names if i % 2 == 0 else names[::-1]  # who starts first alternates
            result = one_round(ctx, services.bootstrap, {n: trees[n] for n in order}, args.count)
            rounds.append(result)
            print(i, json.dumps(result), flush=True)
    finally:
        services.close()
    first, second = names
    for figure in ("promotions_per_s", "cpu_us_per_promotion", "missing", "duplicates"):
        a = [r[first][figure] for r in rounds]
        b = [r[second][figure] for r in rounds]
        ratios = [y / x if x else float("nan") for x, y in zip(a, b, strict=True)]
        print(
            f"{figure}: {first} {statistics.median(a):,.2f}  {second} {statistics.median(b):,.2f}"
            f"  ratios {[round(r, 3) for r in ratios]}"
        )
    (ctx.folder / "rounds.json").write_text(json.dumps(rounds))


if __name__ == "__main__":
    main()

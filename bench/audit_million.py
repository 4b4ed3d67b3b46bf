"""Benchmark: the Spark audit of 1,000,000 transactions on ``local[2]``.

Generates the transactions straight into the topics (halves, ops, promoted records, as
producers, checker and relay would write them; :class:`outbox.testing.stream.StreamWriter`),
with a few seeded anomalies, then runs the audit in a fresh process the way an operator would
(``python -m checker.audit --master local[2]``) and prints how long it took, phase by phase.
Not part of ``make test``; ``make bench-audit`` runs it.

    .venv/bin/python bench/audit_million.py [--transactions 1000000] [--bootstrap host:port]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from outbox.protocol.states import DecidedBy, OpState
from outbox.testing import start_kafka
from outbox.testing.stream import StreamTxn, StreamWriter

CHUNK = 50_000
#: Anomalies seeded among the clean transactions, so the report has something to show.
SEEDED = 10


def generate(bootstrap: str, prefix: str, topic: str, transactions: int) -> dict[str, int]:
    """Write the transactions in chunks; returns what was written."""
    writer = StreamWriter(bootstrap, prefix=prefix, partitions=6, group="bench")
    _create_topic(bootstrap, topic, 6)
    rng = random.Random(1)
    written = {"transactions": 0, "messages": 0, "lost": 0, "duplicate": 0}
    started = time.monotonic()
    for first in range(0, transactions, CHUNK):
        size = min(CHUNK, transactions - first)
        batch: list[StreamTxn] = []
        for i in range(first, first + size):
            count = 1 if rng.random() < 0.7 else (2 if rng.random() < 0.67 else 3)
            key = f"customer-{rng.randrange(50_000)}".encode()
            value = json.dumps({"order": i, "amount": rng.randrange(10_000)}).encode()
            batch.append(writer.begin([(topic, key, value)] * count))
            written["messages"] += count
        writer.flush()
        for t in batch:
            state = OpState.ROLLBACK if rng.random() < 0.1 else OpState.COMMIT
            by = DecidedBy.CHECKER if rng.random() < 0.05 else DecidedBy.PRODUCER
            writer.decide(t, state, decided_by=by)
            if state is not OpState.COMMIT:
                continue
            if first == 0 and written["lost"] < SEEDED:
                written["lost"] += 1  # committed, never promoted
                continue
            writer.promote(t)
            if first == 0 and written["duplicate"] < SEEDED:
                written["duplicate"] += 1
                writer.promote(t, [0])
        writer.flush()
        written["transactions"] += size
        rate = written["transactions"] / (time.monotonic() - started)
        print(f"generated {written['transactions']:>9} transactions ({rate:,.0f}/s)", flush=True)
    writer.close()
    return written


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions)])[topic].result(30)


def audit(bootstrap: str, prefix: str, out: Path, master: str) -> tuple[int, float]:
    """The audit as an operator runs it, in its own process; (exit code, wall seconds)."""
    command = [
        sys.executable, "-m", "checker.audit",
        "--bootstrap-servers", bootstrap,
        "--topic-prefix", prefix,
        "--as-of", "now+10m",
        "--master", master,
        "--out", str(out),
    ]  # fmt: skip
    started = time.monotonic()
    code = subprocess.run(command, check=False).returncode
    return code, time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--transactions", type=int, default=1_000_000)
    parser.add_argument("--bootstrap", help="an existing broker (default: start a local one)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="audit-bench-"))
    kafka = None if args.bootstrap else start_kafka(provider="local")
    bootstrap = args.bootstrap or (kafka.address if kafka else "")
    try:
        stamp = int(time.time())
        prefix, topic = f"__outbox-bench-{stamp}", f"bench-orders-{stamp}"
        began = time.monotonic()
        written = generate(bootstrap, prefix, topic, args.transactions)
        generated = time.monotonic() - began
        code, seconds = audit(bootstrap, prefix, out, args.master)
        summary = json.loads((out / "summary.json").read_text())
    finally:
        if kafka is not None:
            kafka.stop()
    found = {name: f["count"] for name, f in summary["findings"].items() if f["count"]}
    print(
        f"\ngenerated {written['transactions']:,} transactions, {written['messages']:,} "
        f"messages in {generated:.0f} s"
    )
    print(
        f"audit on {args.master}: {seconds:.0f} s wall (exit {code}), phases {summary['timings_s']}"
    )
    print(f"findings {found} (seeded: lost {written['lost']}, duplicate {written['duplicate']})")
    print(f"report {out / 'report.html'}")
    expected = {"lost": written["lost"], "duplicate": written["duplicate"]}
    return 0 if code == 1 and found == {k: v for k, v in expected.items() if v} else 1


if __name__ == "__main__":
    sys.exit(main())

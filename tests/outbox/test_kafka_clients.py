"""Every Kafka client of the library, the relay and the checker is made by
:mod:`outbox.kafka_clients`, so that each one logs through Python logging and none is made in a
forked process that could never connect it (:func:`outbox.fork_checks.check_if_forked`).

A client made anywhere else would skip both: before, a forked worker that made its own producer
or started its check endpoint's heartbeat made clients that never connected, and hung in
``close()`` (walked end to end in ``tests/outbox/test_fork_checks.py``). This test finds such a
call by reading the code, so that a new one cannot slip in unseen.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: What the product runs (``outbox/testing`` is tooling for tests; the CLI's clients are its own).
PACKAGES = ("outbox", "relay", "checker")
EXEMPT = {Path("outbox/kafka_clients.py")}
CLIENTS = {"Producer", "Consumer", "AdminClient"}


def _client_calls(path: Path) -> list[str]:
    calls = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if name in CLIENTS:
            calls.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}(...)")
    return calls


def test_no_kafka_client_is_made_outside_kafka_clients() -> None:
    files = [
        path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.relative_to(ROOT) not in EXEMPT and "testing" not in path.relative_to(ROOT).parts
    ]
    assert len(files) > 100  # the packages were found
    assert [call for path in files for call in _client_calls(path)] == []

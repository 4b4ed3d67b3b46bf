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
CLIENTS = {
    *("Producer", "Consumer", "AdminClient", "SerializingProducer", "DeserializingConsumer"),
    *("ShareConsumer", "DeserializingShareConsumer"),
    *("AIOProducer", "AIOConsumer", "AsyncSerializingProducer", "AsyncDeserializingConsumer"),
}


def _client_calls(path: Path) -> list[str]:
    """Each call of a client class in ``path`` (by name or attribute), and each import of one
    under another name (which a call by that name would hide)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name in CLIENTS:
                found.append(f"{where}: {name}(...)")
        elif isinstance(node, ast.ImportFrom):
            found += [
                f"{where}: {alias.name} imported as {alias.asname}"
                for alias in node.names
                if alias.name in CLIENTS and alias.asname not in (None, alias.name)
            ]
    return found


def test_no_kafka_client_is_made_outside_kafka_clients() -> None:
    files = [
        path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.relative_to(ROOT) not in EXEMPT
        and path.relative_to(ROOT).parts[:2] != ("outbox", "testing")
    ]
    assert len(files) > 100  # the packages were found
    assert [call for path in files for call in _client_calls(path)] == []

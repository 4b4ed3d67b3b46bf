"""The asyncio check endpoint: the ASGI lifespan runs the heartbeat, and the evidence table is
read through an AsyncEngine (aiosqlite here) with the very answers of the synchronous resolver,
while the event loop keeps turning during the database's lock wait."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from outbox import migrations
from outbox.checks import CHECK_PATH
from outbox.checks.asgi import CheckApp
from outbox.checks.async_resolver import AsyncFencedResolver
from outbox.checks.auth import sign
from outbox.checks.handler import CheckSettings
from outbox.checks.resolver import FencedResolver
from outbox.checks.routing import CheckRouter
from outbox.evidence import write_evidence
from outbox.protocol import new_transaction_id
from outbox.protocol.check import CheckedTransaction
from outbox.protocol.states import CheckBy

SECRET = b"k"


@pytest.fixture
def sqlite_file(tmp_path: Path) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    migrations.upgrade(url)
    yield url


def checks(*ids: str) -> list[CheckedTransaction]:
    return [CheckedTransaction(t, check_by=CheckBy.EVIDENCE) for t in ids]


def test_the_async_resolver_answers_as_the_synchronous_one_on_the_same_rows(
    sqlite_file: str,
) -> None:
    engine = sa.create_engine(sqlite_file)
    committed, fenced_before, unknown = (new_transaction_id() for _ in range(3))
    with sa.orm.Session(engine) as session, session.begin():
        write_evidence(session, committed, "orders")
    sync_answers = FencedResolver(engine, "orders").resolve(checks(fenced_before))

    async def main() -> dict[str, Any]:
        async_engine = create_async_engine(sqlite_file.replace("sqlite:", "sqlite+aiosqlite:"))
        try:
            resolver = AsyncFencedResolver(async_engine, "orders")
            return await resolver.resolve(checks(committed, fenced_before, unknown))
        finally:
            await async_engine.dispose()

    answers = asyncio.run(main())
    assert sync_answers == {fenced_before: "ROLLBACK"}
    # the committed one COMMIT, the one fenced before still ROLLBACK, the new one fenced now
    assert answers == {committed: "COMMIT", fenced_before: "ROLLBACK", unknown: "ROLLBACK"}
    assert FencedResolver(engine, "orders").resolve(checks(unknown)) == {unknown: "ROLLBACK"}
    engine.dispose()


def test_a_check_waiting_for_a_held_lock_answers_unknown_and_never_blocks_the_loop(
    sqlite_file: str,
) -> None:
    """A producer's open transaction holds SQLite's write lock: the check's fence waits its
    lock_timeout on aiosqlite's thread and answers UNKNOWN, while a ticker keeps turning."""
    engine = sa.create_engine(sqlite_file)
    held = engine.connect()
    held.exec_driver_sql("BEGIN IMMEDIATE")  # the write lock, as a producer's transaction has
    late: list[float] = []
    txn_id = new_transaction_id()

    async def main() -> dict[str, Any]:
        async_engine = create_async_engine(sqlite_file.replace("sqlite:", "sqlite+aiosqlite:"))
        resolver = AsyncFencedResolver(async_engine, "orders", lock_timeout_s=1.0)
        stop = asyncio.Event()

        async def ticker() -> None:
            while not stop.is_set():
                before = time.monotonic()
                await asyncio.sleep(0.01)
                late.append(time.monotonic() - before - 0.01)

        ticking = asyncio.create_task(ticker())
        try:
            return await resolver.resolve(checks(txn_id))
        finally:
            stop.set()
            await ticking
            await async_engine.dispose()

    started = time.monotonic()
    answers = asyncio.run(main())
    held.rollback()
    held.close()
    engine.dispose()
    assert answers == {txn_id: "UNKNOWN"}
    assert time.monotonic() - started >= 1.0  # it did wait for the lock
    assert len(late) > 50 and max(late) < 0.05, max(late)


def drive(app: CheckApp, messages: list[dict[str, Any]], scope: dict[str, Any]) -> list[dict]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent


def test_the_lifespan_starts_and_stops_the_heartbeat_and_running_does_too() -> None:
    events: list[str] = []

    def start() -> Any:
        events.append("start")
        return lambda: events.append("stop")

    app = CheckApp(CheckSettings(secret=SECRET), CheckRouter(None, lambda: None), start=start)
    sent = drive(
        app,
        [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}],
        {"type": "lifespan"},
    )
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert events == ["start", "stop"]

    async def mounted() -> None:
        async with app.running():
            assert events[-1] == "start"
        assert events[-1] == "stop"

    asyncio.run(mounted())
    assert events == ["start", "stop", "start", "stop"]

    def failing() -> Any:
        raise OSError("kafka unreachable")

    broken = CheckApp(CheckSettings(secret=SECRET), CheckRouter(None, lambda: None), start=failing)
    sent = drive(broken, [{"type": "lifespan.startup"}], {"type": "lifespan"})
    assert sent == [{"type": "lifespan.startup.failed", "message": "kafka unreachable"}]


def test_a_mounted_app_answers_below_its_prefix(sqlite_file: str) -> None:
    """Starlette leaves the mount prefix in ``path`` and names it in ``root_path``."""
    engine = sa.create_engine(sqlite_file)
    app = CheckApp(
        CheckSettings(secret=SECRET), CheckRouter(FencedResolver(engine, "orders"), lambda: None)
    )
    txn_id = new_transaction_id()
    body = json.dumps({"txn_ids": [txn_id]}).encode()
    headers = sign(SECRET, "POST", CHECK_PATH, body)
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/internal" + CHECK_PATH,
        "root_path": "/internal",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
    }
    sent = drive(app, [{"type": "http.request", "body": body}], scope)
    assert sent[0]["status"] == 200
    assert json.loads(sent[1]["body"]) == {"states": {txn_id: "ROLLBACK"}}
    engine.dispose()


def test_the_pruning_rule_holds_for_the_async_resolver(sqlite_file: str) -> None:
    """A transaction older than the pruning horizon is UNKNOWN, never fenced (as synchronous)."""
    from outbox.pruning import prune_evidence

    engine = sa.create_engine(sqlite_file)
    old = new_transaction_id()
    time.sleep(0.01)
    prune_evidence(
        engine, older_than=dt.timedelta(days=1), now=dt.datetime.now(dt.UTC) + dt.timedelta(days=2)
    )

    async def main() -> dict[str, Any]:
        async_engine = create_async_engine(sqlite_file.replace("sqlite:", "sqlite+aiosqlite:"))
        try:
            return await AsyncFencedResolver(async_engine, "orders").resolve(checks(old))
        finally:
            await async_engine.dispose()

    assert asyncio.run(main()) == {old: "UNKNOWN"}
    engine.dispose()


def test_the_mount_prefix_is_cut_on_a_path_boundary_only() -> None:
    from outbox.checks.asgi import _path

    assert _path({"path": "/internal/outbox/check", "root_path": "/internal"}) == CHECK_PATH
    assert _path({"path": "/outbox/check", "root_path": "/out"}) == CHECK_PATH  # not "box/check"
    assert _path({"path": CHECK_PATH, "root_path": ""}) == CHECK_PATH


def test_an_async_check_with_no_running_application_loop_answers_unknown() -> None:
    """Its engine's connections belong to the application's loop; a loop of the answering
    thread's own would bind them to a loop that is then closed (found in review)."""
    from outbox.checks.listener import FunctionResolver
    from outbox.protocol.half import HalfMessage, HalfRecord

    asked: list[str] = []

    async def check(msg: Any) -> Any:
        asked.append(msg.transaction_id)
        return "COMMIT"

    resolver = FunctionResolver(check)
    txn_id = new_transaction_id()
    half = HalfRecord(
        txn_id=txn_id,
        producer_group="orders",
        message=HalfMessage(topic="orders", value=b"v", key=b"k"),
        index=0,
        count=1,
        created_at_ms=0,
        check_count=0,
        partition=0,
        offset=0,
    )
    checked = CheckedTransaction(txn_id, check_by=CheckBy.LISTENER, half=half)
    assert resolver.resolve([checked]) == {txn_id: "UNKNOWN"}
    assert asked == []

"""``examples/fastapi_orders`` under uvicorn with two workers, a relay and a checker, on real
Kafka and PostgreSQL (psycopg's async mode) or SQLite (aiosqlite).

Hundreds of concurrent HTTP orders, one in six declined on purpose; halfway through, one worker is
killed with SIGKILL while its ops wait in the producer's queue (``OUTBOX_OP_LINGER_MS``), so the
checker has to ask the surviving workers' check endpoint. Then the user's view: every order row
in the database is delivered exactly once to a ``read_committed`` consumer, no declined order is
in either, and no message is delivered without its row.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from outbox import OutboxSettings, migrations
from outbox.protocol.registry import decode_registration
from outbox.protocol.states import DecidedBy
from outbox.testing.ports import free_port
from tests.checker.test_checker import SECRET
from tests.outbox.test_asyncio import async_url
from tests.pipeline import pipeline
from tests.producer_fixtures import Topics
from tests.relay.test_relay import read_topic

pytestmark = [pytest.mark.integration, pytest.mark.processes]

EXAMPLE = Path(__file__).parents[2] / "examples" / "fastapi_orders"
ORDERS = 300


@pytest.fixture
def shop_db(db_url: str) -> Iterator[str]:
    """The outbox's tables and the example's own, on the same database."""
    migrations.upgrade(db_url)
    sys.path.insert(0, str(EXAMPLE))
    try:
        from schema import create_tables

        asyncio.run(create_tables(async_url(db_url)))
    finally:
        sys.path.remove(str(EXAMPLE))
    yield db_url


class Uvicorn:
    """``uvicorn app:app --workers 2`` for the example, its log in a file."""

    def __init__(self, env: dict[str, str], port: int, log: Path) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self.process = subprocess.Popen(
            [
                *(sys.executable, "-m", "uvicorn", "app:app", "--app-dir", str(EXAMPLE)),
                *("--host", "127.0.0.1", "--port", str(port), "--workers", "2"),
            ],
            env={**os.environ, **env},
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            started = self.log.read_text().count("Application startup complete")
            try:
                if started >= 2 and httpx.get(self.url + "/openapi.json", timeout=2).is_success:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, self.log.read_text()[-3000:]
            time.sleep(0.3)

    def workers(self) -> list[int]:
        """The worker processes' pids, as uvicorn logs them when they start."""
        found = re.findall(r"Started server process \[(\d+)\]", self.log.read_text())
        return [int(p) for p in found]

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


async def place_all(url: str, orders: list[dict], kill_after: int, kill: object) -> dict[str, str]:
    """POST every order, 40 at a time; after ``kill_after`` have been sent, ``kill()``.
    Order id -> "placed" (201), "declined" (402) or what else happened."""
    outcomes: dict[str, str] = {}
    limit = asyncio.Semaphore(40)
    sent = 0

    async def one(client: httpx.AsyncClient, order: dict) -> None:
        nonlocal sent
        async with limit:
            sent += 1
            if sent == kill_after:
                kill()  # type: ignore[operator]
            try:
                reply = await client.post(url + "/orders", json=order, timeout=60)
                outcomes[order["order_id"]] = {201: "placed", 402: "declined"}.get(
                    reply.status_code, f"HTTP {reply.status_code}"
                )
            except httpx.HTTPError as err:
                outcomes[order["order_id"]] = f"error {type(err).__name__}"

    async with httpx.AsyncClient() as client:
        await asyncio.gather(*(one(client, o) for o in orders))
    return outcomes


def test_the_fastapi_example_delivers_each_committed_order_once_through_a_killed_worker(
    kafka_bootstrap: str,
    outbox_settings: OutboxSettings,
    topics: Topics,
    shop_db: str,
    tmp_path: Path,
) -> None:
    group = f"shop-{uuid.uuid4().hex[:6]}"
    with pipeline(kafka_bootstrap, topics) as running:
        port = free_port()
        env = {
            "OUTBOX_BOOTSTRAP_SERVERS": kafka_bootstrap,
            "OUTBOX_PRODUCER_GROUP": group,
            "OUTBOX_TOPIC_PREFIX": outbox_settings.topic_prefix,
            # ops wait 2 s in the producer's queue: a worker killed now loses its last ones
            "OUTBOX_OP_LINGER_MS": "2000",
            "OUTBOX_CHECK_SECRET": SECRET,  # the checker's (pipeline) too
            "OUTBOX_CHECK_ADVERTISE_URL": f"http://127.0.0.1:{port}",
            "ORDERS_DATABASE_URL": async_url(shop_db),
            "ORDERS_TOPIC": running.topic,
        }
        server = Uvicorn(env, port, tmp_path / "uvicorn.log")
        try:
            server.wait_ready()
            first_workers = server.workers()
            assert len(first_workers) == 2, server.log.read_text()[-2000:]
            rng = random.Random(7)
            orders = [
                {
                    "order_id": f"o-{uuid.uuid4().hex[:10]}",
                    "customer": f"c{rng.randrange(20)}",
                    "amount_cents": rng.randrange(100, 10_000),
                    "decline": rng.random() < 1 / 6,
                }
                for _ in range(ORDERS)
            ]
            victim = first_workers[0]
            outcomes = asyncio.run(
                place_all(server.url, orders, ORDERS // 2, lambda: os.kill(victim, signal.SIGKILL))
            )
            # Then the database and the topic agree, order by order
            rows = shop_rows(shop_db)
            delivered = settle(kafka_bootstrap, running.topic, rows)
            by_outcome = Counter(v.split(" ")[0] for v in outcomes.values())
            declined = {o for o, v in outcomes.items() if v == "declined"}
            placed = {o for o, v in outcomes.items() if v == "placed"}
            assert by_outcome["placed"] > ORDERS / 2, by_outcome
            assert by_outcome["declined"] > 10, by_outcome
            assert placed <= rows
            assert not declined & rows
            assert dict(delivered) == dict.fromkeys(rows, 1)
            # and the checker found the workers' endpoints: the killed worker's lost ops were
            # decided from the evidence rows through a surviving (or restarted) worker
            ours = {t.txn_id for t in topics.halves()}
            by_checker = [
                op
                for op in topics.ops()
                if op.txn_id in ours and op.decided_by is DecidedBy.CHECKER
            ]
            print(
                f"outcomes {dict(by_outcome)}, rows {len(rows)}, by the checker {len(by_checker)}"
            )
            assert by_checker, "no op was lost: the kill came too late to test the checker"
            assert {op.state.value for op in by_checker} <= {"COMMIT", "ROLLBACK"}
            instances = registered(kafka_bootstrap, outbox_settings, group)
            assert len(instances) >= 2, instances  # each worker its own instance id
            assert set(instances.values()) == {server.url}
        finally:
            server.stop()


def delivered_orders(bootstrap: str, topic: str) -> Counter[str]:
    """Order ids of the OrderPlaced events a read_committed consumer reads now."""
    return Counter(json.loads(m.value())["order_id"] for m in read_topic(bootstrap, topic))


def settle(bootstrap: str, topic: str, expected: set[str], timeout: float = 120) -> Counter[str]:
    """Wait until every expected order was delivered, then a little longer (a duplicate or a
    phantom would show up then); what was delivered."""
    deadline = time.monotonic() + timeout
    while not set(delivered_orders(bootstrap, topic)) >= expected:
        missing = expected - set(delivered_orders(bootstrap, topic))
        assert time.monotonic() < deadline, f"not delivered: {sorted(missing)[:20]}"
        time.sleep(0.5)
    time.sleep(2)
    return delivered_orders(bootstrap, topic)


def shop_rows(db_url: str) -> set[str]:
    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as conn:
            return set(conn.execute(sa.text("SELECT id FROM shop_orders")).scalars())
    finally:
        engine.dispose()


def registered(bootstrap: str, settings: OutboxSettings, group: str) -> dict[str, str]:
    """Instance id -> URL of ``group``'s registrations ever written to the registry topic."""
    found = {}
    for msg in read_topic(bootstrap, settings.topics.registry):
        registration = decode_registration(msg.value())
        if registration is not None and registration.group == group:
            found[registration.instance_id] = registration.check_url
    return found

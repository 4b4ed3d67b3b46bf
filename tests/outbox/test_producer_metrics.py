"""The producer's Prometheus metrics, read back from the registry after real transactions: sends
and ops in both forms, checks answered by the threaded and the ASGI endpoint from the evidence
table and the listener, fences, ops the op topic refused, and a real checker deciding lost ops.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from prometheus_client import REGISTRY, CollectorRegistry
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import Session, sessionmaker

import outbox
from outbox import (
    LocalTransactionState,
    Message,
    OutboxProducer,
    OutboxSettings,
    TransactionalProducer,
)
from outbox.checks import CHECK_PATH
from outbox.checks.auth import sign
from outbox.checks.server import CheckServer
from outbox.message import MessageView
from outbox.protocol import new_transaction_id
from tests.checker.test_checker import SECRET
from tests.kafka_helpers import set_topic_config
from tests.outbox.test_asyncio import async_factory, async_url
from tests.pipeline import ops_lost, pipeline
from tests.producer_fixtures import Topics, order_ids, orders

GROUP = "orders"


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    """A sample of this test's producer group (None: no such series)."""
    return registry.get_sample_value(name, {"group": GROUP, **labels})


def answered(registry: CollectorRegistry) -> dict[str, float | None]:
    return {
        a: sample(registry, "outbox_producer_checks_answered_total", answer=a)
        for a in ("COMMIT", "ROLLBACK", "UNKNOWN")
    }


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def metered(
    outbox_settings: OutboxSettings, registry: CollectorRegistry
) -> Iterator[OutboxProducer]:
    with OutboxProducer(outbox_settings, metrics_registry=registry) as producer:
        yield producer


def _order() -> str:
    return f"order-{uuid.uuid4().hex[:10]}"


class Declined(Exception):
    pass


def _sync_transactions(producer: OutboxProducer, factory: sessionmaker) -> None:
    """Committed with two sends, rolled back with one."""
    with producer.transaction(factory) as txn:
        txn.send("orders", b"a", key="k1")
        txn.send_batch([Message("orders", b"b", key="k1")])
    with pytest.raises(Declined), producer.transaction(factory) as txn:
        txn.send("orders", b"c", key="k2")
        raise Declined


async def _async_transactions(producer: OutboxProducer, db_url: str) -> None:
    """The same, in the asyncio form."""
    async with async_factory(db_url) as factory:
        async with producer.transaction(factory) as txn:
            await txn.send("orders", b"a", key="k1")
            await txn.send_batch([Message("orders", b"b", key="k1")])
        with pytest.raises(Declined):
            async with producer.transaction(factory) as txn:
                await txn.send("orders", b"c", key="k2")
                raise Declined


@pytest.mark.integration
@pytest.mark.parametrize("form", ["sync", "asyncio"])
def test_both_forms_count_each_acknowledged_send_and_each_op_alike(
    metered: OutboxProducer,
    registry: CollectorRegistry,
    session_factory: sessionmaker,
    db_url: str,
    topics: Topics,
    form: str,
) -> None:
    if form == "sync":
        _sync_transactions(metered, session_factory)
    else:
        asyncio.run(_async_transactions(metered, db_url))
    # Then three sends were acknowledged, each measured, none failed
    assert sample(registry, "outbox_producer_half_send_seconds_count") == 3
    assert 0 < (sample(registry, "outbox_producer_half_send_seconds_sum") or 0) < 30
    assert sample(registry, "outbox_producer_half_send_seconds_bucket", le="+Inf") == 3
    assert sample(registry, "outbox_producer_half_send_failures_total", reason="timeout") is None
    # and one COMMIT and one ROLLBACK op were written, as the op topic shows
    for state in ("COMMIT", "ROLLBACK"):
        assert sample(registry, "outbox_producer_ops_written_total", state=state) == 1
        assert sample(registry, "outbox_producer_ops_failed_total", state=state) == 0
    assert sorted(o.state.value for o in topics.ops()) == ["COMMIT", "ROLLBACK"]
    # and the producer's own counters still count
    assert (metered.kafka.ops_sent, metered.kafka.ops_failed) == (2, 0)


def ask(server: CheckServer, txn_ids: list[str]) -> dict[str, str]:
    """A signed check, as the checker sends it, to a threaded endpoint."""
    body = json.dumps({"txn_ids": txn_ids}).encode()
    request = urllib.request.Request(
        server.url + CHECK_PATH,
        data=body,
        headers=sign(SECRET.encode(), "POST", CHECK_PATH, body),
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        states: dict[str, str] = json.loads(response.read())["states"]
        return states


@pytest.mark.integration
def test_a_check_through_the_threaded_endpoint_that_fences_a_transaction_is_counted(
    metered: OutboxProducer,
    registry: CollectorRegistry,
    session_factory: sessionmaker,
    engine: sa.Engine,
) -> None:
    server = metered.serve_checks(engine=engine, secret=SECRET, host="127.0.0.1", port=0)
    with metered.transaction(session_factory) as txn:
        txn.send("orders", b"committed", key="k")
    committed = txn.txn_id
    order_id = _order()
    late_ids: list[str] = []
    answers: list[dict[str, str]] = []

    @outbox.transactional(producer=metered, session_factory=session_factory)
    def late(*, session: Session) -> None:
        # The checker asks before this transaction wrote anything: the check fences it
        late_ids.append(outbox.current_transaction().txn_id)
        answers.append(ask(server, [late_ids[0], committed]))
        outbox.send("orders", b"late", key=order_id)
        session.execute(orders.insert().values(id=order_id, amount=1))

    with pytest.raises(outbox.TransactionFencedError):
        late()
    assert answers == [{late_ids[0]: "ROLLBACK", committed: "COMMIT"}]
    assert order_id not in order_ids(engine)
    # Then one fence, one answer of each, and the fenced transaction's ROLLBACK op
    assert sample(registry, "outbox_producer_fences_total") == 1
    assert answered(registry) == {"COMMIT": 1, "ROLLBACK": 1, "UNKNOWN": 0}
    assert sample(registry, "outbox_producer_ops_written_total", state="ROLLBACK") == 1
    # and asking again answers from the fence row, fencing nothing more
    assert ask(server, late_ids) == {late_ids[0]: "ROLLBACK"}
    assert sample(registry, "outbox_producer_fences_total") == 1
    assert answered(registry)["ROLLBACK"] == 2


@pytest.mark.integration
def test_the_asgi_endpoint_counts_its_answers_and_fences_alike(
    metered: OutboxProducer,
    registry: CollectorRegistry,
    session_factory: sessionmaker,
    db_url: str,
) -> None:
    with metered.transaction(session_factory) as txn:
        txn.send("orders", b"committed", key="k")
    never_seen = new_transaction_id()

    async def main() -> dict[str, str]:
        engine = create_async_engine(async_url(db_url))
        try:
            app = metered.check_app(
                engine=engine, secret=SECRET, advertise_url="http://127.0.0.1:1"
            )
            body = json.dumps({"txn_ids": [txn.txn_id, never_seen]}).encode()
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
                headers = sign(SECRET.encode(), "POST", CHECK_PATH, body)
                response = await client.post(CHECK_PATH, content=body, headers=headers)
            states: dict[str, str] = response.json()["states"]
            return states
        finally:
            await engine.dispose()

    assert asyncio.run(main()) == {txn.txn_id: "COMMIT", never_seen: "ROLLBACK"}
    assert answered(registry) == {"COMMIT": 1, "ROLLBACK": 1, "UNKNOWN": 0}
    assert sample(registry, "outbox_producer_fences_total") == 1


@pytest.mark.integration
def test_an_op_the_op_topic_refuses_is_counted_as_failed(
    kafka_bootstrap: str,
    outbox_settings: OutboxSettings,
    registry: CollectorRegistry,
    session_factory: sessionmaker,
) -> None:
    # Given an op topic that refuses every op (too large for it), half topic untouched
    set_topic_config(kafka_bootstrap, outbox_settings.topics.op, "max.message.bytes", "16")
    with OutboxProducer(outbox_settings, metrics_registry=registry) as producer:
        with producer.transaction(session_factory) as txn:
            txn.send("orders", b"x", key="k")
        # Then the transaction committed, its op counted failed (the checker decides it)
        assert sample(registry, "outbox_producer_ops_failed_total", state="COMMIT") == 1
        assert sample(registry, "outbox_producer_ops_written_total", state="COMMIT") == 0
        assert producer.kafka.ops_failed == 1


class Committing:
    """A listener whose local transactions commit (their ops are lost in the test)."""

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT

    def check_local_transaction(self, msg: MessageView) -> LocalTransactionState:
        return LocalTransactionState.COMMIT


@pytest.mark.integration
def test_lost_ops_decided_by_a_real_checker_count_the_endpoint_s_answers(
    kafka_bootstrap: str,
    metered: OutboxProducer,
    registry: CollectorRegistry,
    session_factory: sessionmaker,
    engine: sa.Engine,
    topics: Topics,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given the producer's endpoint answering from the evidence table and from its listener
    sender = TransactionalProducer(metered, Committing())
    metered.serve_checks(engine=engine, secret=SECRET)
    with pipeline(kafka_bootstrap, topics) as running:
        # and a committed transaction of each kind whose op was lost
        with ops_lost(metered, monkeypatch):
            with metered.transaction(session_factory) as txn:
                txn.send(running.topic, b"by-evidence", key="k")
            result = sender.send_message_in_transaction(
                Message(running.topic, b"by-listener", key="k")
            )
        # When the checker decides them through the endpoint
        decided = running.decided([txn.txn_id, result.transaction_id])
    # Then both were answered COMMIT, counted so, and nothing was fenced
    assert set(decided.values()) == {"COMMIT"}
    counts = answered(registry)
    assert (counts["COMMIT"] or 0) >= 2 and counts["ROLLBACK"] == 0, counts
    assert sample(registry, "outbox_producer_fences_total") == 0
    # and the lost ops were never sent, so none was counted written or failed
    assert sample(registry, "outbox_producer_ops_written_total", state="COMMIT") == 0
    assert sample(registry, "outbox_producer_ops_failed_total", state="COMMIT") == 0


def test_producers_sharing_a_registry_share_its_collectors_under_their_groups() -> None:
    """Several producers in one process: one set of collectors per registry, one series per
    group, and no "Duplicated timeseries" - in a registry of their own or the default one."""
    registry = CollectorRegistry()
    settings = OutboxSettings(bootstrap_servers="127.0.0.1:9", producer_group="a")
    other = dataclasses.replace(settings, producer_group="b")
    with (
        OutboxProducer(settings, metrics_registry=registry) as a,
        OutboxProducer(settings, metrics_registry=registry) as a_again,
        OutboxProducer(other, metrics_registry=registry) as b,
        OutboxProducer(settings) as in_default,
        OutboxProducer(other) as b_in_default,
    ):
        for producer in (a, a_again, b):
            assert producer.metrics is not None
            producer.metrics.fenced()
        assert in_default.metrics is not None and b_in_default.metrics is not None
        in_default.metrics.fenced()

    def fences(where: CollectorRegistry, group: str) -> float | None:
        return where.get_sample_value("outbox_producer_fences_total", {"group": group})

    assert (fences(registry, "a"), fences(registry, "b")) == (2, 1)
    assert (fences(REGISTRY, "a") or 0) >= 1 and fences(REGISTRY, "b") is not None


_WITHOUT_PROMETHEUS = """
import asyncio, json, sys
sys.modules["prometheus_client"] = None  # as if not installed: importing it raises ImportError

import httpx
import sqlalchemy as sa

import outbox
from outbox import HalfSendError, OutboxProducer, OutboxSettings, migrations
from outbox.checks import CHECK_PATH
from outbox.half_sender import HalfBatch
from outbox.protocol import DecidedBy, HalfMessage, OpRecord, OpState, new_transaction_id

url = sys.argv[1]
migrations.upgrade(url)
engine = sa.create_engine(url)
# a broker that is not there: the half send fails quickly
settings = OutboxSettings(
    bootstrap_servers="127.0.0.1:9", producer_group="orders", send_timeout_s=0.5, send_attempts=1
)
result = {}
producer = OutboxProducer(settings)
result["metrics"] = repr(producer.metrics)
txn_id = new_transaction_id()
try:
    producer.kafka.send_halves(HalfBatch(txn_id, 0, 0, [HalfMessage("orders", b"x", b"k")], 1))
except HalfSendError as err:
    result["send"] = err.reason
app = producer.check_app(engine=engine, insecure_local=True, advertise_url="http://127.0.0.1:1")

async def check():
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        body = json.dumps({"txn_ids": [txn_id]}).encode()
        return (await client.post(CHECK_PATH, content=body)).json()

result["check"] = asyncio.run(check())["states"][txn_id]
producer.close(timeout=1)
op = OpRecord(txn_id, OpState.COMMIT, "orders", 0, (0,), DecidedBy.PRODUCER, 0)
result["op"] = producer.kafka.send_op(op)
result["ops_failed"] = producer.kafka.ops_failed
print(json.dumps(result))
"""


def test_without_prometheus_client_the_producer_sends_answers_and_counts_as_before(
    tmp_path: Any,
) -> None:
    """A producer application without prometheus_client: nothing to import, metrics None,
    every counted path (a half send, a check answered and fenced, a failed op) still works."""
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'app.db'}"
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_PROMETHEUS, url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {
        "metrics": "None",
        "send": result["send"],
        "check": "ROLLBACK",
        "op": False,
        "ops_failed": 1,
    }
    assert result["send"] in {"refused", "timeout"}


def test_importing_outbox_does_not_import_prometheus_client() -> None:
    """It is imported when a producer is made: a process that only imports outbox (the CLI, a
    script reading settings) pays nothing for it."""
    import subprocess
    import sys

    code = "import sys, outbox, outbox.producer; print('prometheus_client' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


def test_the_readme_names_every_producer_metric() -> None:
    from pathlib import Path

    from prometheus_client import generate_latest

    from outbox.metrics import producer_metrics

    registry = CollectorRegistry()
    metrics = producer_metrics("orders", registry)
    assert metrics is not None
    metrics.half_failed("timeout")  # a series for the family labelled on the spot
    names = set(re.findall(r"^# TYPE (\S+)", generate_latest(registry).decode(), re.M))
    names = {n for n in names if not n.endswith("_created")}  # prometheus_client's own
    assert len(names) == 7, names
    readme = Path(__file__).parents[2].joinpath("README.md").read_text()
    section = readme.split("### Metrics and alerts")[1].split("\n### ")[0]
    assert [n for n in sorted(names) if f"`{n}`" not in section] == []

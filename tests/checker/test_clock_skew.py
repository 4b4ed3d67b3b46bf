"""A producer host whose clock is 10 minutes off still has its transactions resolved.

Its check endpoint runs in a process of its own whose wall clock is 10 minutes ahead (an
``LD_PRELOAD`` shim, ``skewed_clock.c``, shifts ``CLOCK_REALTIME``; its monotonic clock, like a
real host's, is untouched): the request timestamps it accepts, its evidence rows and the
transaction ids it would create all read the wrong time. Check timing already uses the broker's
clock; the check's signature must not depend on the producer's clock either, while a stale,
replayed or tampered request is still refused.

The checker's own host may be the one whose clock is off: ``python -m checker`` under the same
shim still finds the live producers and decides by their answers (a relay ahead:
tests/relay/test_relay_clock_skew.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

import outbox
from outbox import OutboxProducer
from outbox.checks.auth import sign
from outbox.protocol import new_transaction_id
from outbox.protocol.check import CHECK_PATH, CheckedTransaction, encode_request, new_nonce
from outbox.protocol.states import TERMINAL_STATES
from relay import RelaySettings
from tests.checker.processes import CheckerProcess
from tests.checker.test_checker import SECRET, wait_for
from tests.clock_fixtures import SKEW_S, skewed_env
from tests.kafka_helpers import create_topic, unique
from tests.pipeline import ops_lost, pipeline
from tests.producer_fixtures import Topics, order_ids, orders
from tests.relay.test_relay import RelayThread, read_topic

pytestmark = [pytest.mark.integration, pytest.mark.processes]
CHILD = Path(__file__).with_name("skewed_endpoint.py")


@pytest.fixture
def skewed_endpoint(
    kafka_bootstrap: str, topics: Topics, db_url: str, skewed_clock: Path
) -> Iterator[tuple[str, float]]:
    """The group's only check endpoint, in a process whose clock is 10 minutes ahead: its URL
    and its clock when it started."""
    child = subprocess.Popen(
        [sys.executable, str(CHILD), kafka_bootstrap, topics.settings.topic_prefix, db_url],
        stdout=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "PYTHONPATH": str(CHILD.parents[2]),
            **skewed_env(skewed_clock),
        },
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("READY "), line
        _, url, clock = line.split()
        yield url, float(clock)
    finally:
        child.kill()
        child.wait(30)


ON_TIME = """
import json, sys, time, uuid
from confluent_kafka import Producer
producer = Producer({"bootstrap.servers": sys.argv[1]})
started = time.monotonic()
producer.poll(0.5)
polled = time.monotonic() - started
delivered = []
topic = f"skewed-{uuid.uuid4().hex}"  # new: its metadata is fetched again until it is created
producer.produce(topic, b"x", on_delivery=lambda err, _: delivered.append(str(err)))
started = time.monotonic()
producer.flush(30)
print(json.dumps([polled, delivered, time.monotonic() - started]), flush=True)
"""


def test_a_kafka_client_on_the_skewed_clock_keeps_its_timeouts(
    kafka_bootstrap: str, skewed_clock: Path
) -> None:
    """The shim models a host whose clock is wrong, not a process whose waits are: librdkafka
    waits until wall-clock deadlines, which a real host's kernel reads from the same wrong
    clock. Before the shim took the skew off those deadlines, ``poll(0.5)`` took 10 minutes and
    a message to a new topic stayed undelivered, so the endpoint's heartbeat could go unseen."""
    env = {**os.environ, **skewed_env(skewed_clock)}
    try:
        done = subprocess.run(
            [sys.executable, "-c", ON_TIME, kafka_bootstrap],
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("a Kafka client under the skewed clock stalled for 90 s", pytrace=False)
    assert done.returncode == 0, done.stderr
    polled, delivered, flushed = json.loads(done.stdout)
    assert polled < 5, done.stdout  # poll(0.5) returns after about half a second
    assert delivered == ["None"] and flushed < 30, done.stdout


def test_a_producer_whose_clock_is_ten_minutes_off_has_its_transactions_resolved(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    session_factory: sessionmaker,
    engine: sa.Engine,
    topics: Topics,
    skewed_endpoint: tuple[str, float],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, their_clock = skewed_endpoint
    assert their_clock - time.time() > SKEW_S - 60  # the endpoint's clock really is ahead
    # Given a committed and a rolled-back transaction whose op records were lost
    with pipeline(kafka_bootstrap, topics, no_producer_timeout_s=20) as running:
        ids, txn_ids = _ops_lost(producer, session_factory, running.topic, monkeypatch)
        # Then the checker, told the endpoint's clock, resolves both from its answers
        decided = running.decided(txn_ids.values(), timeout=60)
        assert decided == {txn_ids["committed"]: "COMMIT", txn_ids["declined"]: "ROLLBACK"}
        assert running.settle(lambda: {ids["committed"]}) == {ids["committed"]: 1}
        assert set(order_ids(engine)) & set(ids.values()) == {ids["committed"]}
    # And requests signed on a clock 10 minutes off, replayed or tampered are still refused
    body = _body()
    stale = _post(url, body, sign(SECRET.encode(), "POST", CHECK_PATH, body))
    assert stale[0] == 401 and "stale" in stale[1]["error"]
    assert abs(stale[1]["time"] - (time.time() + SKEW_S)) < 60
    signed = sign(SECRET.encode(), "POST", CHECK_PATH, body, now=time.time() + SKEW_S)
    assert _post(url, body, signed)[0] == 200
    replayed = _post(url, body, signed)
    assert replayed[0] == 401 and "replayed" in replayed[1]["error"]
    tampered = _post(url, body.replace(b'"nonce":"', b'"nonce":"0'), signed)
    assert tampered[0] == 401 and "wrong signature" in tampered[1]["error"]


def _body() -> bytes:
    asked = [CheckedTransaction(new_transaction_id())]
    return encode_request(asked, nonce=new_nonce(), instance_id=None, max_bytes=65536)


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    request = urllib.request.Request(url + CHECK_PATH, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_a_checker_whose_clock_is_ten_minutes_ahead_still_finds_the_producers_and_resolves(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    session_factory: sessionmaker,
    engine: sa.Engine,
    topics: Topics,
    skewed_clock: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The checker's own host 10 minutes ahead: a producer's heartbeat, stamped by the broker,
    looked 10 minutes old to it, so no instance was live, nobody was asked, and every
    transaction whose op was lost was given up after ``no_producer_timeout_s`` (its committed
    messages on the dead-letter topic). It now measures heartbeats and checks on the broker's
    clock (``outbox.broker_clock``)."""
    producer.serve_checks(engine=engine, secret=SECRET)  # this process: the right clock
    checker = CheckerProcess(
        kafka_bootstrap,
        topics.settings.topic_prefix,
        unique("checker"),
        "ahead",
        tmp_path / "checker.log",
        no_producer_timeout_s=20,
    )
    checker.env |= skewed_env(skewed_clock)
    topic = unique("orders")
    create_topic(kafka_bootstrap, topic, partitions=3)
    relay = RelayThread(
        RelaySettings(
            bootstrap_servers=kafka_bootstrap,
            topic_prefix=topics.settings.topic_prefix,
            group_id=unique("relay"),
        )
    )
    checker.start()
    try:
        # Given a committed and a rolled-back transaction whose op records were lost
        ids, txn_ids = _ops_lost(producer, session_factory, topic, monkeypatch)
        # Then the checker ahead asks this producer and decides each by its answer
        wanted = {txn_ids["committed"]: "COMMIT", txn_ids["declined"]: "ROLLBACK"}
        wait_for(lambda: len(_first_ops(topics, wanted)) == 2, 60)
        assert _first_ops(topics, wanted) == wanted, checker.log.read_text()[-3000:]
        # and a read_committed reader gets the committed order once, beside its row
        wait_for(lambda: bool(read_topic(kafka_bootstrap, topic)), 60)
        time.sleep(2)  # a repeat would have come by now
        assert [m.value() for m in read_topic(kafka_bootstrap, topic)] == [
            ids["committed"].encode()
        ]
        assert set(order_ids(engine)) & set(ids.values()) == {ids["committed"]}
    finally:
        try:
            checker.signal(signal.SIGTERM)
            assert checker.proc is not None
            checker.proc.wait(30)
        finally:
            relay.stop()


def _first_ops(topics: Topics, wanted: dict[str, str]) -> dict[str, str]:
    """Each wanted transaction's first terminal op's state."""
    first: dict[str, str] = {}
    for op in topics.ops():
        if op.txn_id in wanted and op.state in TERMINAL_STATES:
            first.setdefault(op.txn_id, op.state.value)
    return first


def _ops_lost(
    producer: OutboxProducer,
    session_factory: sessionmaker,
    topic: str,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[dict[str, str], dict[str, str]]:
    """A committed and a rolled-back order, one message each to ``topic``, their op records
    lost: the order ids and the transaction ids, by kind (``committed``, ``declined``)."""
    ids = {kind: f"{kind}-{uuid.uuid4().hex[:8]}" for kind in ("committed", "declined")}
    txn_ids: dict[str, str] = {}

    @outbox.transactional(producer=producer, session_factory=session_factory)
    def place(kind: str, *, session: Session) -> None:
        txn_ids[kind] = outbox.current_transaction().txn_id
        outbox.send(topic, ids[kind], key=ids[kind])
        session.execute(orders.insert().values(id=ids[kind], amount=1))
        if kind == "declined":
            raise LookupError(kind)

    with ops_lost(producer, monkeypatch):
        place("committed")
        with pytest.raises(LookupError):
            place("declined")
    return ids, txn_ids

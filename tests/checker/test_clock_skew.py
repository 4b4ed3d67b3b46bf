"""A producer host whose clock is 10 minutes off still has its transactions resolved.

Its check endpoint runs in a process of its own whose wall clock is 10 minutes ahead (an
``LD_PRELOAD`` shim, ``skewed_clock.c``, shifts ``CLOCK_REALTIME``; its monotonic clock, like a
real host's, is untouched): the request timestamps it accepts, its evidence rows and the
transaction ids it would create all read the wrong time. Check timing already uses the broker's
clock; the check's signature must not depend on the producer's clock either, while a stale,
replayed or tampered request is still refused.
"""

from __future__ import annotations

import json
import os
import shutil
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
from outbox.testing import HarnessSettings
from tests.checker.test_checker import SECRET
from tests.pipeline import ops_lost, pipeline
from tests.producer_fixtures import Topics, order_ids, orders

pytestmark = [pytest.mark.integration, pytest.mark.processes]
CHILD = Path(__file__).with_name("skewed_endpoint.py")
SKEW_S = 600


@pytest.fixture(scope="session")
def skewed_clock(
    tmp_path_factory: pytest.TempPathFactory, harness_settings: HarnessSettings
) -> Path:
    """The shim, built with gcc."""
    gcc = shutil.which("gcc")
    if gcc is None:
        message = "gcc is not installed (it builds tests/checker/skewed_clock.c); run `make setup`"
        if harness_settings.ci:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    built = tmp_path_factory.mktemp("skewed-clock") / "skewed_clock.so"
    source = CHILD.with_name("skewed_clock.c")
    subprocess.run(
        [gcc, "-shared", "-fPIC", "-O2", "-o", str(built), str(source), "-ldl"], check=True
    )
    return built


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
            "LD_PRELOAD": str(skewed_clock),
            "SKEWED_CLOCK_SECONDS": str(SKEW_S),
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
    env = {**os.environ, "LD_PRELOAD": str(skewed_clock), "SKEWED_CLOCK_SECONDS": str(SKEW_S)}
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
        ids = {kind: f"{kind}-{uuid.uuid4().hex[:8]}" for kind in ("committed", "declined")}
        txn_ids: dict[str, str] = {}

        @outbox.transactional(producer=producer, session_factory=session_factory)
        def place(kind: str, *, session: Session) -> None:
            txn_ids[kind] = outbox.current_transaction().txn_id
            outbox.send(running.topic, ids[kind], key=ids[kind])
            session.execute(orders.insert().values(id=ids[kind], amount=1))
            if kind == "declined":
                raise LookupError(kind)

        with ops_lost(producer, monkeypatch):
            place("committed")
            with pytest.raises(LookupError):
                place("declined")
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

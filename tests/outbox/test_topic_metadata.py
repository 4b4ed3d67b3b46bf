"""A topic listing read again when the connection under it drops (:mod:`outbox.topic_metadata`).

Before, a producer's first transaction in a process failed with ``HalfSendError`` ("cannot read
metadata ... Broker transport failure") when its bootstrap connection closed at that read, and
``ensure_topics`` with ``KafkaOperationError`` ("cannot list topics"), although the broker
answered a moment later. The real path runs through :mod:`tests.metadata_proxy`; the retries
and their bounds on a fake client and clock.

Through the proxy, whether the outbox's own read meets a dropped connection, or librdkafka's
requests at the client's start take every drop first, is librdkafka's timing: the real path
asserts that the transaction outlasted the drops, the fake client that each retry happens.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import replace

import pytest
import sqlalchemy as sa
from confluent_kafka import KafkaError, KafkaException, Producer
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import sessionmaker

from outbox import OutboxProducer, OutboxSettings, ensure_topics
from outbox.errors import HalfSendError
from outbox.kafka_logging import log_to_python
from outbox.testing.ports import free_port
from outbox.topic_metadata import read_topic_metadata
from tests.kafka_helpers import unique
from tests.metadata_proxy import metadata_dropping_proxy
from tests.outbox.test_asyncio import async_factory
from tests.pipeline import pipeline
from tests.producer_fixtures import (
    Topics,
    order_ids,
    orders,
    place_order,
    settings_on_a_fresh_prefix,
)

#: Metadata requests whose connection the proxy closes: librdkafka's own call failed with 4 or 8
#: in each of 4 tries, with 12 in 3 of 4 (it retries some requests itself).
DROPS = 6


@pytest.mark.integration
def test_a_first_transaction_outlasts_connections_dropped_at_its_metadata_read(
    kafka_bootstrap: str,
    outbox_settings: OutboxSettings,
    topics: Topics,
    engine: sa.Engine,
    db_url: str,
) -> None:
    with (
        metadata_dropping_proxy(kafka_bootstrap) as proxy,
        pipeline(kafka_bootstrap, topics) as running,
    ):
        # Given producers whose bootstrap connections close at their first 6 Metadata requests
        settings = replace(outbox_settings, bootstrap_servers=proxy.bootstrap, send_timeout_s=15)
        proxy.drop(DROPS)
        attempted: list[str] = []
        # When each form's first transaction in its process (the context manager, then the
        # asyncio one) meets them
        with OutboxProducer(settings) as producer:
            placed = place_order(producer, sessionmaker(engine), running.topic, b"k", attempted)
        assert proxy.dropped == DROPS, "the proxy dropped fewer requests: nothing was tested"
        proxy.drop(DROPS)

        async def place_async() -> str:
            order_id = f"order-{uuid.uuid4().hex[:12]}"
            attempted.append(order_id)
            with OutboxProducer(settings) as producer:
                async with async_factory(db_url) as factory, producer.transaction(factory) as txn:
                    assert isinstance(txn.session, AsyncSession)
                    await txn.session.execute(orders.insert().values(id=order_id, amount=1))
                    await txn.send(running.topic, order_id, key=b"k")
            return order_id

        placed_async = asyncio.run(place_async())
        assert proxy.dropped == 2 * DROPS
        # Then both commit, once each, with rows and messages agreeing
        running.agree(order_ids(engine), committed=[placed, placed_async], refused=[])


@pytest.mark.integration
def test_ensure_topics_outlasts_connections_dropped_at_its_listing(kafka_bootstrap: str) -> None:
    with metadata_dropping_proxy(kafka_bootstrap) as proxy:
        settings = OutboxSettings(
            bootstrap_servers=proxy.bootstrap,
            producer_group="g",
            topic_prefix=unique("__outbox-dropped"),
            partitions=2,
        )
        proxy.drop(DROPS)
        created = ensure_topics(settings, timeout=15)
        assert proxy.dropped == DROPS
    assert sorted(created) == sorted(settings.topics.all())


@pytest.mark.integration
def test_a_bootstrap_that_refuses_fails_the_first_transaction_within_send_timeout(
    engine: sa.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    settings = replace(settings_on_a_fresh_prefix(f"127.0.0.1:{free_port()}"), send_timeout_s=2)
    attempted: list[str] = []
    started = time.monotonic()
    with (
        OutboxProducer(settings) as producer,
        pytest.raises(HalfSendError, match=r"within send_timeout_s \(2 s\).*OUTBOX_SEND_TIMEOUT_S"),
    ):
        place_order(producer, sessionmaker(engine), "orders", b"k", attempted)
    assert time.monotonic() - started < 4  # the retries kept inside the timeout
    assert not _retries(caplog)  # librdkafka waited out the whole timeout: no time left
    assert not set(attempted) & set(order_ids(engine))


class FakeClient:
    """Fails ``list_topics`` with each of ``errors`` in turn, then answers; time passes only
    in the waits it is given, on a fake clock."""

    def __init__(self, errors: list[int], *, call_s: float = 0.0) -> None:
        self.errors = errors
        self.call_s = call_s
        self.now = 0.0
        self.timeouts: list[float] = []
        self.started: list[float] = []  # when each call came
        self.sleeps: list[float] = []

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> object:
        self.timeouts.append(timeout)
        self.started.append(self.now)
        self.now += min(self.call_s, timeout)
        if self.errors:
            raise KafkaException(KafkaError(self.errors.pop(0)))
        return "metadata"

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s

    def read(self, timeout_s: float) -> object:
        return read_topic_metadata(
            self, timeout_s, what="k:9092", sleep=self.sleep, clock=lambda: self.now
        )


def _retries(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith("reading topic metadata")]


def test_transient_failures_are_read_again_after_a_half_sends_pauses(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = FakeClient([KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN])
    with caplog.at_level(logging.WARNING, logger="outbox"):
        assert client.read(10) == "metadata"
    assert client.sleeps == [0.1, 0.2]
    assert client.timeouts == [10, pytest.approx(9.9), pytest.approx(9.7)]
    # the first retry warned, naming where from; the next one at DEBUG only
    assert [(r.levelno, r.getMessage().split(";")[0]) for r in _retries(caplog)] == [
        (
            logging.WARNING,
            f"reading topic metadata from k:9092 failed ({KafkaError(KafkaError._TRANSPORT)})",
        )
    ]


def test_a_failure_no_retry_can_pass_is_raised_at_once() -> None:
    client = FakeClient([KafkaError.TOPIC_AUTHORIZATION_FAILED])
    with pytest.raises(KafkaException) as raised:
        client.read(10)
    assert raised.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert client.sleeps == []


@pytest.mark.parametrize("call_s", [0.0, 0.3])
def test_retries_stop_inside_the_timeout(call_s: float) -> None:
    # Given a connection that drops at every read (each taking call_s)
    client = FakeClient([KafkaError._TRANSPORT] * 1000, call_s=call_s)
    # When it is read with 5 s
    with pytest.raises(KafkaException) as raised:
        client.read(5)
    # Then the last error is raised before 5 s have passed, no attempt was given more time
    # than was left, and the pauses grew to 2 s at most
    assert raised.value.args[0].code() == KafkaError._TRANSPORT
    assert client.now < 5
    assert all(t <= 5 - s + 1e-9 for t, s in zip(client.timeouts, client.started, strict=True))
    assert max(client.sleeps) <= 2.0
    assert client.sleeps == sorted(client.sleeps)


@pytest.mark.parametrize("error", [KafkaError._TIMED_OUT, KafkaError._TRANSPORT])
def test_a_failure_with_no_time_left_for_its_pause_is_raised(error: int) -> None:
    client = FakeClient([error], call_s=9.95)
    with pytest.raises(KafkaException):
        client.read(10)
    assert len(client.timeouts) == 1 and client.sleeps == []


@pytest.mark.parametrize("timeout_s", [0, -1])
def test_a_timeout_of_zero_or_less_is_librdkafkas_own_no_retry(timeout_s: float) -> None:
    client = FakeClient([KafkaError._TRANSPORT])
    with pytest.raises(KafkaException):
        client.read(timeout_s)
    assert client.timeouts == [timeout_s] and client.sleeps == []


def test_a_refused_bootstrap_is_read_for_its_whole_timeout_and_no_longer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    producer = Producer(log_to_python({"bootstrap.servers": f"127.0.0.1:{free_port()}"}))
    started = time.monotonic()
    with pytest.raises(KafkaException) as raised:
        read_topic_metadata(producer, 1.5)
    assert 1.4 < time.monotonic() - started < 2.5
    assert raised.value.args[0].code() == KafkaError._TRANSPORT
    assert not _retries(caplog)

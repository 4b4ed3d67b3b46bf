"""The checker resolves every unknown outcome, and never wrongly.

Modelled on RocketMQ's own transactional integration test: commit at once, rollback at once,
commit via check, rollback via check, and UNKNOWN forever, mixed in one run.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

import outbox
from checker import Checker, CheckerSettings
from outbox import (
    LocalTransactionState,
    Message,
    OutboxProducer,
    OutboxSettings,
    TransactionalProducer,
)
from outbox.checks.listener import FunctionResolver
from outbox.protocol import DecidedBy, OpState, decode_half
from relay import Relay, RelaySettings
from tests.kafka_helpers import unique
from tests.producer_fixtures import Topics, orders
from tests.relay.test_relay import read_topic

pytestmark = pytest.mark.integration
SECRET = "checker-test-secret"


class Background:
    """Runs a service's blocking run() in a thread until the test ends."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self.thread = threading.Thread(
            target=service.run, name=f"background-{type(service).__name__}", daemon=True
        )
        self.thread.start()

    def stop(self) -> None:
        self.service.close()
        self.thread.join(30)


def checker_settings(bootstrap: str, prefix: str, **overrides: Any) -> CheckerSettings:
    """A checker in a group of its own, checking after 1 s, every 1 s, at most 3 times."""
    values: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "secret": SECRET,
        "topic_prefix": prefix,
        "group_id": unique("checker"),
        "transaction_timeout_s": 1,
        "check_interval_s": 1,
        "check_max": 3,
    }
    return CheckerSettings(**(values | overrides))


@contextmanager
def checker_and_relay(bootstrap: str, prefix: str, **overrides: Any) -> Iterator[Checker]:
    """A checker (:func:`checker_settings`, with ``overrides``) and a relay creating real
    topics, until the block ends."""
    checker = Checker(checker_settings(bootstrap, prefix, **overrides))
    running = [
        Background(checker),
        Background(
            Relay(
                RelaySettings(
                    bootstrap_servers=bootstrap,
                    topic_prefix=prefix,
                    group_id=unique("relay"),
                    auto_create_topics=True,
                )
            )
        ),
    ]
    try:
        yield checker
    finally:
        for service in running:
            service.stop()


@pytest.fixture
def services(kafka_bootstrap: str, outbox_settings: OutboxSettings) -> Iterator[Checker]:
    with checker_and_relay(kafka_bootstrap, outbox_settings.topic_prefix) as checker:
        yield checker


def wait_for(predicate: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.5)


class Forever:
    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN


def test_five_outcome_classes_end_in_exactly_the_committed_set_and_a_dead_letter(
    kafka_bootstrap: str,
    outbox_settings: OutboxSettings,
    producer: OutboxProducer,
    session_factory: sessionmaker,
    engine: sa.Engine,
    topics: Topics,
    services: Checker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = unique("orders")
    producer.serve_checks(engine=engine, secret=SECRET)
    legacy = OutboxProducer(
        OutboxSettings(
            bootstrap_servers=kafka_bootstrap,
            producer_group="legacy",
            topic_prefix=outbox_settings.topic_prefix,
            partitions=3,
        )
    )
    legacy.serve_checks(
        resolver=FunctionResolver(lambda t: LocalTransactionState.UNKNOWN), secret=SECRET
    )
    outcome: dict[str, str] = {}

    @outbox.transactional(producer=producer, session_factory=session_factory)
    def place(kind: str, *, session: Session) -> None:
        order_id = f"{kind}-{uuid.uuid4().hex[:8]}"
        outcome[order_id] = kind
        outbox.send(topic, order_id, key=order_id)
        session.execute(orders.insert().values(id=order_id, amount=1))
        if kind.startswith("rollback"):
            raise RuntimeError(kind)

    for _ in range(3):
        place("commit-at-once")
        with pytest.raises(RuntimeError):
            place("rollback-at-once")
    # The op messages of these are lost, as RocketMQ's one-way end-transaction may be
    monkeypatch.setattr(producer.kafka, "send_op", lambda op: False)
    for _ in range(3):
        place("commit-via-check")
        with pytest.raises(RuntimeError):
            place("rollback-via-check")
    monkeypatch.undo()
    forever = TransactionalProducer(legacy, Forever()).send_message_in_transaction(
        Message(topic, b"unknown-forever", key=b"unknown-forever")
    )

    def delivered() -> set[str]:
        return {m.value().decode() for m in read_topic(kafka_bootstrap, topic)}

    committed = {o for o, kind in outcome.items() if kind.startswith("commit")}
    wait_for(lambda: delivered() >= committed)
    wait_for(lambda: services.stats.given_up >= 1)
    time.sleep(2)  # a phantom or duplicate would show up now

    # Then a read_committed consumer received exactly the committed set, each once
    values = [m.value().decode() for m in read_topic(kafka_bootstrap, topic)]
    assert sorted(values) == sorted(committed)
    ops = {o.txn_id: o for o in topics.ops()}
    by_checker = [o for o in ops.values() if o.decided_by is DecidedBy.CHECKER]
    assert sorted(o.state for o in by_checker) == sorted(
        [OpState.COMMIT] * 3 + [OpState.ROLLBACK] * 3 + [OpState.GIVEN_UP]
    )
    assert ops[forever.transaction_id].state is OpState.GIVEN_UP
    # And UNKNOWN forever ended given up, its message in the dead-letter topic with the reason
    [letter] = read_topic(kafka_bootstrap, outbox_settings.topics.dead_letter)
    headers = dict(letter.headers())
    assert letter.value() == b"unknown-forever"
    parked = decode_half(value=letter.value(), headers=letter.headers())  # its own headers
    assert parked.txn_id == forever.transaction_id
    assert b"still UNKNOWN after 3 checks" in headers["outbox-dl-reason"]
    legacy.close()

"""RocketMQ's form end to end: ``check_local_transaction(message)`` resolves what no op decided.

A listener whose local transaction is an order row in its own database, with the producer's
check endpoint served the default way (``serve_checks(engine=...)``). Every outcome of
``execute_local_transaction`` (COMMIT with its op lost, ROLLBACK, UNKNOWN, an exception, a value
of the wrong type, a slow local transaction) and of ``check_local_transaction`` (an exception,
a wrong type, no answer in time) ends with the rows in the database and what a
``read_committed`` consumer received agreeing - never a ROLLBACK for committed work.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

import outbox
from outbox import (
    LocalTransactionState,
    Message,
    MessageView,
    OutboxProducer,
    OutboxSettings,
    TransactionalProducer,
)
from outbox.checks.listener import FunctionResolver
from outbox.protocol import OpState
from tests.checker.test_checker import SECRET
from tests.pipeline import ops_lost, pipeline
from tests.producer_fixtures import Topics, evidence_ids, order_ids, orders

pytestmark = pytest.mark.integration
State = LocalTransactionState


@dataclass(frozen=True)
class Plan:
    """What one local transaction does: commit its row or not, how long it takes, what
    ``execute_local_transaction`` returns (a state, ``"raise"`` or ``"wrong type"``), whether
    its op is lost, and the quirks of its first checks before the truth."""

    commit: bool
    result: Any
    op_lost: bool = False
    seconds: float = 0.0
    check_quirks: tuple[str, ...] = ()
    messages: int = 1


PLANS = {
    "commit": Plan(True, State.COMMIT),
    "commit, op lost": Plan(True, State.COMMIT, op_lost=True),
    "commit, two messages, op lost": Plan(True, State.COMMIT, op_lost=True, messages=2),
    "commit, then UNKNOWN": Plan(True, State.UNKNOWN),
    "commit, then raise": Plan(True, "raise"),
    "commit, then a wrong type": Plan(True, "wrong type"),
    "rollback": Plan(False, State.ROLLBACK),
    "nothing, UNKNOWN": Plan(False, State.UNKNOWN),
    "nothing, raise": Plan(False, "raise"),
    "slow commit, UNKNOWN": Plan(True, State.UNKNOWN, seconds=3.5),
    "slow commit, op lost": Plan(True, State.COMMIT, op_lost=True, seconds=3.5),
    "commit, checks raise, mistype and hang first": Plan(
        True, State.UNKNOWN, check_quirks=("raise", "wrong type", "hang")
    ),
}


@dataclass
class OrdersListener:
    """The application's listener: the local transaction inserts the order row."""

    engine: sa.Engine
    checked: list[MessageView] = field(default_factory=list)
    quirks: dict[str, list[str]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def execute_local_transaction(self, msg: Message, plan: Plan) -> Any:
        order_id = msg.key  # as the application passed it: a str
        self.quirks[order_id] = list(plan.check_quirks)
        time.sleep(plan.seconds)  # a slow payment provider: checks come meanwhile
        if plan.commit:
            with self.engine.begin() as conn:
                conn.execute(orders.insert().values(id=order_id, amount=1))
        if plan.result == "raise":
            raise RuntimeError("the listener fails after its local work")
        if plan.result == "wrong type":
            return "COMMIT"  # a str, not a LocalTransactionState
        return plan.result

    def check_local_transaction(self, msg: MessageView) -> Any:
        with self.lock:
            self.checked.append(msg)
            quirks = self.quirks.get(msg.key.decode(), [])
            quirk = quirks.pop(0) if quirks else None
        if quirk == "raise":
            raise ConnectionError("the orders database is down")
        if quirk == "wrong type":
            return None
        if quirk == "hang":
            time.sleep(3)  # past the answer timeout (1 s here)
        with self.engine.connect() as conn:
            found = conn.execute(sa.select(orders.c.id).where(orders.c.id == msg.key.decode()))
            return State.COMMIT if found.first() else State.ROLLBACK


@pytest.fixture
def listener(engine: sa.Engine) -> OrdersListener:
    return OrdersListener(engine)


@pytest.fixture
def sender(
    producer: OutboxProducer, listener: OrdersListener, engine: sa.Engine
) -> Iterator[TransactionalProducer]:
    transactional = TransactionalProducer(producer, listener, answer_timeout_s=1)
    producer.serve_checks(engine=engine, secret=SECRET)  # the default way
    yield transactional


def test_every_listener_outcome_ends_with_the_database_and_the_topic_agreeing(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    sender: TransactionalProducer,
    listener: OrdersListener,
    engine: sa.Engine,
    topics: Topics,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pipeline(kafka_bootstrap, topics, check_max=8) as running:
        order_of: dict[str, str] = {}
        results = {}
        for name, plan in PLANS.items():
            order_id = f"order-{uuid.uuid4().hex[:10]}"
            order_of[name] = order_id
            messages = [
                Message(
                    running.topic,
                    f"{order_id}#{i}",
                    key=order_id,
                    headers={"trace": f"t-{order_id}"},
                    properties={"source": "listener-test"},
                )
                for i in range(plan.messages)
            ]
            lost = ops_lost(producer, monkeypatch) if plan.op_lost else contextlib.nullcontext()
            with lost:
                results[name] = sender.send_message_in_transaction(messages, arg=plan)
        decided = running.decided(r.transaction_id for r in results.values())
        # Then every committed order was delivered, each message once, and nothing else
        rows = set(order_ids(engine))
        committed = {n for n, p in PLANS.items() if p.commit}
        assert {n for n in PLANS if order_of[n] in rows} == committed
        expected = {f"{order_of[n]}#{i}" for n in committed for i in range(PLANS[n].messages)}
        delivered = running.settle(lambda: expected)
        assert set(delivered) == expected and set(delivered.values()) == {1}
        assert {n: decided[results[n].transaction_id] for n in PLANS} == {
            n: "COMMIT" if n in committed else "ROLLBACK" for n in PLANS
        }
        # and no evidence row was written or fenced for them: the listener answered
        assert not set(evidence_ids(engine)) & {r.transaction_id for r in results.values()}
    # The check saw the half message the transaction sent, with what identifies it
    name = "commit, two messages, op lost"
    [view, *_] = [v for v in listener.checked if v.transaction_id == results[name].transaction_id]
    order_id = order_of[name]
    assert (view.topic, view.key) == (running.topic, order_id.encode())
    assert view.value == f"{order_id}#0".encode()
    assert dict(view.headers) == {"trace": f"t-{order_id}".encode(), "source": b"listener-test"}
    assert view.properties == {"trace": f"t-{order_id}", "source": "listener-test"}
    assert (view.producer_group, view.message_index, view.message_count) == ("orders", 0, 2)
    half = results[name].half
    assert (view.partition, view.offset) == (half.partition, half.offsets[0])
    # and the slow ones were checked while still running here, answered UNKNOWN unasked
    assert running.checker.stats.unknown >= 2


def test_a_listener_transaction_checked_where_no_listener_is_set_is_never_fenced(
    kafka_bootstrap: str,
    outbox_settings: OutboxSettings,
    producer: OutboxProducer,
    engine: sa.Engine,
    topics: Topics,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a transaction sent through TransactionalProducer, committed, its op lost, and its
    # producer gone; the group's only endpoint left serves the evidence table and no listener
    listener = OrdersListener(engine)
    order_id = f"order-{uuid.uuid4().hex[:10]}"
    with pipeline(kafka_bootstrap, topics, check_max=2) as running:
        with ops_lost(producer, monkeypatch):
            result = TransactionalProducer(producer, listener).send_message_in_transaction(
                Message(running.topic, order_id, key=order_id), arg=Plan(True, State.COMMIT)
            )
        with OutboxProducer(outbox_settings) as other:
            other.serve_checks(engine=engine, secret=SECRET)
            decided = running.decided([result.transaction_id])
    # Then it was given up (dead-lettered for an operator), never answered ROLLBACK
    assert decided == {result.transaction_id: OpState.GIVEN_UP.value}
    assert result.transaction_id not in evidence_ids(engine)
    assert order_id in order_ids(engine)


def test_a_function_resolver_written_to_the_listener_interface_answers_with_the_message(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    session_factory: sessionmaker,
    engine: sa.Engine,
    topics: Topics,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given the documented alternative for a database without fencing: the application's own
    # check, written to the listener interface, for decorator-form transactions
    listener = OrdersListener(engine)
    producer.serve_checks(
        resolver=FunctionResolver(listener.check_local_transaction), secret=SECRET
    )
    order_id = f"order-{uuid.uuid4().hex[:10]}"
    with pipeline(kafka_bootstrap, topics) as running:

        @outbox.transactional(producer=producer, session_factory=session_factory)
        def place(*, session: Session) -> str:
            outbox.send(running.topic, f"{order_id}#0", key=order_id)
            session.execute(orders.insert().values(id=order_id, amount=1))
            return outbox.current_transaction().txn_id

        with ops_lost(producer, monkeypatch):
            txn_id = place()
        assert running.decided([txn_id]) == {txn_id: "COMMIT"}
        assert running.settle(lambda: {f"{order_id}#0"}) == {f"{order_id}#0": 1}
    assert [v.transaction_id for v in listener.checked] == [txn_id]


def test_one_producer_takes_one_listener(producer: OutboxProducer, engine: sa.Engine) -> None:
    listener = OrdersListener(engine)
    TransactionalProducer(producer, listener)
    TransactionalProducer(producer, listener)  # the same one again: fine
    with pytest.raises(outbox.ConfigurationError, match="one producer group has one listener"):
        TransactionalProducer(producer, OrdersListener(engine))

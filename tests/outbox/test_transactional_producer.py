"""RocketMQ's API: the listener decides; an exception in it means UNKNOWN, as in RocketMQ."""

from __future__ import annotations

import asyncio
import enum
import inspect
from typing import Any

import pytest
import sqlalchemy as sa

from outbox import (
    AsyncTransactionalProducer,
    DelayNotSupportedError,
    InvalidMessageError,
    LocalTransactionState,
    Message,
    OutboxProducer,
    OutboxTransaction,
    TransactionalProducer,
    WrongFormError,
)
from outbox.message import MessageView
from outbox.protocol import DecidedBy, OpState
from tests.checker.test_checker import SECRET
from tests.pipeline import pipeline
from tests.producer_fixtures import Topics, order_ids, orders

pytestmark = pytest.mark.integration


class Listener:
    def __init__(self, answer: LocalTransactionState | Exception) -> None:
        self.answer = answer
        self.executed: list[tuple[Message, Any]] = []

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        self.executed.append((msg, arg))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN


@pytest.mark.parametrize(
    ("answer", "expected_op"),
    [
        (LocalTransactionState.COMMIT, OpState.COMMIT),
        (LocalTransactionState.ROLLBACK, OpState.ROLLBACK),
        (LocalTransactionState.UNKNOWN, None),
        (RuntimeError("db down"), None),
    ],
    ids=["commit", "rollback", "unknown", "listener-raises"],
)
def test_listener_answer_decides_the_op(
    producer: OutboxProducer,
    topics: Topics,
    answer: LocalTransactionState | Exception,
    expected_op: OpState | None,
) -> None:
    listener = Listener(answer)
    sender = TransactionalProducer(producer, listener)
    messages = [Message("orders", b"a", key=b"k"), Message("orders", b"b", key=b"k")]

    result = sender.send_message_in_transaction(messages, arg={"order": 1})

    assert listener.executed == [(messages[0], {"order": 1})]
    expected_state = answer if isinstance(answer, LocalTransactionState) else None
    assert result.local_transaction_state is (expected_state or LocalTransactionState.UNKNOWN)
    halves = [h for h in topics.halves() if h.txn_id == result.transaction_id]
    assert sorted(h.offset for h in halves) == list(result.half.offsets)
    assert {h.count for h in halves} == {2}  # known up front in this form
    ops = [o.state for o in topics.ops() if o.txn_id == result.transaction_id]
    assert ops == ([expected_op] if expected_op else [])


def test_a_delay_level_is_refused_before_anything_is_sent(
    producer: OutboxProducer, topics: Topics
) -> None:
    listener = Listener(LocalTransactionState.COMMIT)
    sender = TransactionalProducer(producer, listener)
    with pytest.raises(DelayNotSupportedError):
        sender.send_message_in_transaction(Message("orders", b"a", delay_level=3))
    assert listener.executed == []
    assert topics.halves() == []


@pytest.mark.parametrize("form", ["sync", "asyncio"])
def test_check_immunity_is_carried_in_whole_seconds_and_anything_else_refused_unsent(
    producer: OutboxProducer, topics: Topics, form: str
) -> None:
    """The relay and the checker read the field as an integer: a record carrying 60.0 (a
    timedelta's total_seconds()) was dead-lettered as undecodable after the listener
    committed, its message never delivered (before the check, the call reported SEND_OK)."""
    listener = Listener(LocalTransactionState.COMMIT)
    if form == "sync":
        send = TransactionalProducer(producer, listener).send_message_in_transaction
    else:
        send_async = AsyncTransactionalProducer(producer, listener).send_message_in_transaction

        def send(msg: Any, arg: Any = None, **options: Any) -> Any:
            return asyncio.run(send_async(msg, arg, **options))

    for wrong in (60.0, True, -1, "60", 2**63):
        with pytest.raises(InvalidMessageError, match=r"check_immunity_s.*whole number.*int\("):
            send(Message("orders", b"a", key=b"k"), check_immunity_s=wrong)
    assert listener.executed == []
    assert topics.halves() == []

    # the transaction object itself (exported) refuses it too
    with pytest.raises(InvalidMessageError, match="check_immunity_s"):
        OutboxTransaction(producer, check_immunity_s=60.0)  # type: ignore[arg-type]

    results = [
        send(Message("orders", b"a", key=b"k"), check_immunity_s=60),
        send(Message("orders", b"b", key=b"k"), check_immunity_s=Seconds.MINUTE),
    ]
    assert {r.local_transaction_state for r in results} == {LocalTransactionState.COMMIT}
    assert {(h.txn_id, h.check_immunity_s) for h in topics.halves()} == {
        (r.transaction_id, 60) for r in results
    }
    assert [o.state for o in topics.ops()] == [OpState.COMMIT] * 2


class Seconds(enum.IntEnum):
    MINUTE = 60


@pytest.mark.parametrize(
    "msg", ["orders", [("orders", b"v")], b"orders", 42], ids=["str", "tuples", "bytes", "int"]
)
def test_anything_but_messages_is_refused_naming_the_type_before_anything_is_sent(
    producer: OutboxProducer, topics: Topics, msg: Any
) -> None:
    listener = Listener(LocalTransactionState.COMMIT)
    sender = TransactionalProducer(producer, listener)
    with pytest.raises(InvalidMessageError, match=r"outbox\.Message.*wrap it"):
        sender.send_message_in_transaction(msg)
    assert listener.executed == []
    assert topics.halves() == []
    # while a tuple or a generator of Messages is taken as before
    for messages in (
        (Message("orders", b"a"), Message("orders", b"b")),
        (Message("orders", v) for v in (b"c", b"d")),
    ):
        sender.send_message_in_transaction(messages)
    assert sorted(h.message.value for h in topics.halves()) == [b"a", b"b", b"c", b"d"]


class AsyncListener:
    async def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN


class AsyncCall:
    async def __call__(self, msg: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT


class AsyncCallListener:
    """Its execute_local_transaction is an object whose __call__ is async."""

    def __init__(self) -> None:
        self.execute_local_transaction = AsyncCall()

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN


@pytest.mark.parametrize("listener", [AsyncListener, AsyncCallListener])
def test_an_async_listener_is_refused_by_the_synchronous_form_when_made(
    producer: OutboxProducer, listener: type
) -> None:
    with pytest.raises(WrongFormError, match="AsyncTransactionalProducer"):
        TransactionalProducer(producer, listener())
    # and not set on the producer: a listener that fits is taken afterwards
    TransactionalProducer(producer, Listener(LocalTransactionState.COMMIT))


class CommitsThenReturnsACoroutine:
    """A plain execute_local_transaction that commits, then returns what an async def made
    (its last call, by mistake, to an async def): the synchronous form cannot run it."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.returned: list[Any] = []

    def execute_local_transaction(self, msg: Message, arg: str) -> Any:
        with self.engine.begin() as conn:
            conn.execute(orders.insert().values(id=arg, amount=1))
        coroutine = self.notify(arg)
        self.returned.append(coroutine)
        return coroutine

    async def notify(self, order_id: str) -> LocalTransactionState:
        return LocalTransactionState.COMMIT

    def check_local_transaction(self, msg: MessageView) -> LocalTransactionState:
        with self.engine.connect() as conn:
            found = conn.execute(sa.select(orders.c.id).where(orders.c.id == msg.key.decode()))
            return LocalTransactionState.COMMIT if found.first() else LocalTransactionState.ROLLBACK


def test_a_coroutine_returned_to_the_synchronous_form_is_closed_and_left_to_the_check(
    kafka_bootstrap: str, producer: OutboxProducer, engine: sa.Engine, topics: Topics
) -> None:
    """Before, the coroutine was dropped unawaited, the call returned UNKNOWN as if the
    listener had said so. Now the caller is told; no op is written (the listener's own code
    committed before it returned), and the check finds the row: delivered once."""
    listener = CommitsThenReturnsACoroutine(engine)
    sender = TransactionalProducer(producer, listener)
    producer.serve_checks(engine=engine, secret=SECRET)
    order_id = "returns-a-coroutine"
    with pipeline(kafka_bootstrap, topics) as running:
        with pytest.raises(WrongFormError, match=r"AsyncTransactionalProducer.*notify.*check"):
            sender.send_message_in_transaction(
                Message(running.topic, order_id, key=order_id), arg=order_id
            )
        [coroutine] = listener.returned
        assert inspect.getcoroutinestate(coroutine) == inspect.CORO_CLOSED
        [half] = [h for h in topics.halves() if h.message.topic == running.topic]
        assert running.decided([half.txn_id]) == {half.txn_id: "COMMIT"}
        assert running.settle(lambda: {order_id}) == {order_id: 1}
        assert order_id in order_ids(engine)
        assert [o.decided_by for o in topics.ops() if o.txn_id == half.txn_id] == [
            DecidedBy.CHECKER
        ]

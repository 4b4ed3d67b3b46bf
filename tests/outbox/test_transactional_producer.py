"""RocketMQ's API: the listener decides; an exception in it means UNKNOWN, as in RocketMQ."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from outbox import (
    AsyncTransactionalProducer,
    DelayNotSupportedError,
    InvalidMessageError,
    LocalTransactionState,
    Message,
    OutboxProducer,
    TransactionalProducer,
    WrongFormError,
)
from outbox.protocol import OpState
from tests.producer_fixtures import Topics

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

    result = send(Message("orders", b"a", key=b"k"), check_immunity_s=60)
    assert result.local_transaction_state is LocalTransactionState.COMMIT
    [half] = topics.halves()
    assert (half.txn_id, half.check_immunity_s) == (result.transaction_id, 60)
    assert [o.state for o in topics.ops()] == [OpState.COMMIT]


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


class AsyncListener:
    async def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN


class AsyncCall:
    def __init__(self) -> None:
        self.ran: list[Message] = []

    async def __call__(self, msg: Message, arg: Any) -> LocalTransactionState:
        self.ran.append(msg)
        return LocalTransactionState.COMMIT


class HiddenAsyncListener:
    """Its execute_local_transaction is an object whose __call__ is async: the synchronous
    form can only tell once it is called."""

    def __init__(self) -> None:
        self.execute_local_transaction = AsyncCall()

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN


def test_an_async_listener_is_refused_by_the_synchronous_form_when_made(
    producer: OutboxProducer, topics: Topics
) -> None:
    with pytest.raises(WrongFormError, match="AsyncTransactionalProducer"):
        TransactionalProducer(producer, AsyncListener())  # type: ignore[arg-type]
    assert topics.halves() == []


@pytest.mark.filterwarnings("error::RuntimeWarning")  # "coroutine ... was never awaited"
def test_a_coroutine_returned_to_the_synchronous_form_is_closed_unrun_and_rolled_back(
    producer: OutboxProducer, topics: Topics
) -> None:
    """Before, the coroutine was dropped unawaited and the transaction left UNKNOWN: every
    check then asked the listener about work that never ran."""
    listener = HiddenAsyncListener()
    sender = TransactionalProducer(producer, listener)  # type: ignore[arg-type]
    with pytest.raises(WrongFormError, match="AsyncTransactionalProducer"):
        sender.send_message_in_transaction(Message("orders", b"a", key=b"k"))
    assert listener.execute_local_transaction.ran == []
    [half] = topics.halves()
    assert [(o.txn_id, o.state) for o in topics.ops()] == [(half.txn_id, OpState.ROLLBACK)]

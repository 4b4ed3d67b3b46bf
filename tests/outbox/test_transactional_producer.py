"""RocketMQ's API: the listener decides; an exception in it means UNKNOWN, as in RocketMQ."""

from __future__ import annotations

from typing import Any

import pytest

from outbox import (
    DelayNotSupportedError,
    LocalTransactionState,
    Message,
    OutboxProducer,
    TransactionalProducer,
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

"""RocketMQ's API: ``TransactionalProducer`` with a ``TransactionListener``.

For code ported from RocketMQ, or local work that is not one SQLAlchemy session. The half
messages are sent first; only when they are acknowledged does the listener's
``execute_local_transaction`` run, and its answer (an exception counts as UNKNOWN, as in RocketMQ)
decides the op. ``check_local_transaction`` is what the check endpoint asks when no op arrived.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from outbox.message import Message
from outbox.producer import OutboxProducer
from outbox.protocol.states import LocalTransactionState
from outbox.transaction import HalfCoordinates, OutboxTransaction

log = logging.getLogger("outbox")


class TransactionListener(Protocol):
    """What the application implements (RocketMQ's ``TransactionListener``)."""

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState: ...

    def check_local_transaction(self, msg: Message) -> LocalTransactionState: ...


class SendStatus(StrEnum):
    SEND_OK = "SEND_OK"


@dataclass(frozen=True)
class TransactionSendResult:
    """RocketMQ's ``TransactionSendResult``: the half send and the local outcome."""

    send_status: SendStatus
    transaction_id: str
    local_transaction_state: LocalTransactionState
    half: HalfCoordinates
    op_written: bool


class TransactionalProducer:
    """Sends messages in transaction, with the listener deciding the outcome."""

    def __init__(self, producer: OutboxProducer, listener: TransactionListener) -> None:
        self.producer = producer
        self.listener = listener

    def send_message_in_transaction(
        self,
        msg: Message | Sequence[Message],
        arg: Any = None,
        *,
        check_immunity_s: int | None = None,
    ) -> TransactionSendResult:
        """Send the half message(s), run the local transaction, write its op.

        Several messages are delivered all-or-nothing (RocketMQ 5 allows one per transaction).
        ``execute_local_transaction`` receives the first message.

        Raises:
            InvalidMessageError: bad input; nothing was sent and the local transaction not run.
            HalfSendError: not acknowledged; the local transaction was not run.
        """
        messages = [msg] if isinstance(msg, Message) else list(msg)
        if not messages:
            raise ValueError("send_message_in_transaction needs at least one message")
        txn = OutboxTransaction(self.producer, check_immunity_s=check_immunity_s)
        halves = [self._build(txn, m) for m in messages]
        coordinates = txn.send_messages(halves, count=len(halves))
        state = self._execute(txn, messages[0], arg)
        written = txn.finish(state)
        return TransactionSendResult(
            send_status=SendStatus.SEND_OK,
            transaction_id=txn.txn_id,
            local_transaction_state=state,
            half=coordinates,
            op_written=written,
        )

    def _build(self, txn: OutboxTransaction, m: Message) -> Any:
        delay = m.delay_level if m.delay_level is not None else m.deliver_at_ms
        return txn.build(m.topic, m.value, m.key, m.headers, delay=delay)

    def _execute(self, txn: OutboxTransaction, msg: Message, arg: Any) -> LocalTransactionState:
        try:
            state = self.listener.execute_local_transaction(msg, arg)
        except Exception:
            log.exception("execute_local_transaction of %s raised; state UNKNOWN", txn.txn_id)
            return LocalTransactionState.UNKNOWN
        if not isinstance(state, LocalTransactionState):
            log.error(
                "execute_local_transaction of %s returned %r, not a LocalTransactionState; "
                "treating it as UNKNOWN",
                txn.txn_id,
                state,
            )
            return LocalTransactionState.UNKNOWN
        return state

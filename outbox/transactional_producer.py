"""RocketMQ's API: ``TransactionalProducer`` with a ``TransactionListener``.

For code ported from RocketMQ, or local work that is not one SQLAlchemy session. The half
messages are sent first; only when they are acknowledged does the listener's
``execute_local_transaction`` run, and its answer (an exception counts as UNKNOWN, as in RocketMQ)
decides the op. When no op arrives (UNKNOWN, or the process died), the checker asks the group's
check endpoint, which hands the transaction's first half message to the listener's
``check_local_transaction`` (:mod:`outbox.checks.listener`): these transactions leave no evidence
row, so the evidence table never answers for them.

:class:`AsyncTransactionalProducer` is the same in asyncio: the half messages are awaited, and a
listener's ``execute_local_transaction`` (and ``check_local_transaction``) may be coroutine
functions, awaited on the application's event loop; a plain function runs in a worker thread, as
it is the application's blocking work.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from outbox import tracing
from outbox.async_transaction import AsyncOutboxTransaction
from outbox.checks.listener import CheckingListener
from outbox.errors import InvalidMessageError, WrongFormError
from outbox.logs import fields
from outbox.message import Message, MessageView, message_headers
from outbox.nesting import outside
from outbox.producer import OutboxProducer
from outbox.protocol.half import HalfMessage
from outbox.protocol.states import CheckBy, LocalTransactionState
from outbox.transaction import HalfCoordinates, OutboxTransaction

log = logging.getLogger("outbox")


class TransactionListener(CheckingListener, Protocol):
    """What the application implements (RocketMQ's ``TransactionListener``): this, and
    ``check_local_transaction(msg: MessageView)``."""

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        """Run the local transaction for ``msg`` (the first message sent) and say how it
        ended; UNKNOWN (or an exception) leaves it to the check."""
        ...


class AsyncTransactionListener(Protocol):
    """A listener whose methods are coroutine functions (either may also be a plain one)."""

    async def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        """As :meth:`TransactionListener.execute_local_transaction`, awaited."""
        ...

    async def check_local_transaction(self, msg: MessageView) -> LocalTransactionState:
        """As :meth:`CheckingListener.check_local_transaction`, awaited on the loop the
        producer sends from."""
        ...


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
    """Sends messages in transaction, with the listener deciding the outcome.

    Creating it sets the listener on ``producer`` (:meth:`OutboxProducer.set_transaction_listener`),
    so the producer's check endpoint (``producer.serve_checks(...)``) answers this producer's
    transactions with ``listener.check_local_transaction``. Create it in every process of the
    group that serves checks.

    Args:
        answer_timeout_s: how long a check waits for ``check_local_transaction``; a later answer
            counts as UNKNOWN. Defaults to 5 s.
    """

    def __init__(
        self,
        producer: OutboxProducer,
        listener: TransactionListener,
        *,
        answer_timeout_s: float = 5.0,
    ) -> None:
        if _is_async(getattr(listener, "execute_local_transaction", None)):
            raise WrongFormError(_async_listener_message(listener))
        self.producer = producer
        self.listener = listener
        self._checks = producer.set_transaction_listener(
            listener, answer_timeout_s=answer_timeout_s
        )

    def send_message_in_transaction(
        self,
        msg: Message | Sequence[Message],
        arg: Any = None,
        *,
        check_immunity_s: int | None = None,
    ) -> TransactionSendResult:
        """Send the half message(s), run the local transaction, write its op.

        Several messages are delivered all-or-nothing (RocketMQ 5 allows one per transaction).
        ``execute_local_transaction`` receives the first message, and so does
        ``check_local_transaction``. While ``execute_local_transaction`` runs, a check of this
        transaction at this process answers UNKNOWN.

        Raises:
            InvalidMessageError: bad input (the messages, ``check_immunity_s``); nothing was
                sent and the local transaction not run.
            HalfSendError: not acknowledged; the local transaction was not run, and the
                transaction's ROLLBACK op was written (its records may be on the half topic:
                the relay drops them, and no check asks the listener about them).
            ConfigurationError: in a process forked from the one serving the checks, the
                transaction could not be marked as executing (:mod:`outbox.checks.executing`);
                nothing was sent.
            ForkedWithLockHeldError: this process was forked with a lock held that its Kafka
                clients need (:mod:`outbox.fork_checks`); nothing was sent and the local
                transaction not run.
            WrongFormError: ``execute_local_transaction`` returned a coroutine, which this
                synchronous form cannot run: it is closed, and the transaction left to the
                check (no op: the listener's own code may have committed before it returned).
        """
        messages = _messages(msg)
        txn = OutboxTransaction(
            self.producer, check_immunity_s=check_immunity_s, check_by=CheckBy.LISTENER
        )
        halves = [_build(txn, m) for m in messages]
        with self._checks.executing(txn.txn_id):
            try:
                coordinates = txn.send_messages(halves, count=len(halves))
            except BaseException:
                _not_run(txn)
                raise
            if tracing.otel is None:
                state = self._execute(txn, messages[0], arg)
            else:
                execute = functools.partial(self._execute, txn, messages[0], arg)
                state = tracing.otel.execute(txn, execute)
            written = txn.finish(state)
        return TransactionSendResult(SendStatus.SEND_OK, txn.txn_id, state, coordinates, written)

    def _execute(self, txn: OutboxTransaction, msg: Message, arg: Any) -> LocalTransactionState:
        try:
            with outside():  # its local transaction is its own, not its caller's
                state = self.listener.execute_local_transaction(msg, arg)
        except Exception:
            log.exception(
                "execute_local_transaction of %s raised; state UNKNOWN",
                txn.txn_id,
                extra=fields(txn_id=txn.txn_id),
            )
            return LocalTransactionState.UNKNOWN
        if inspect.iscoroutine(state):
            # Nothing here can run it. Its own body never ran, but the code that made it may
            # have committed first (a plain def whose last call is an async def), so no op
            # is written: the check asks the listener what happened, as for UNKNOWN.
            state.close()
            raise WrongFormError(
                f"{_async_listener_message(self.listener)}; it returned the coroutine "
                f"{state.__qualname__}, closed unrun, and transaction {txn.txn_id} is left to "
                "its check"
            )
        return _checked(txn.txn_id, state)


class AsyncTransactionalProducer:
    """:class:`TransactionalProducer` for asyncio: ``await
    producer.send_message_in_transaction(msg, arg)``. The listener's methods may be coroutine
    functions (awaited) or plain ones (run in a worker thread, so the loop never waits on them).
    """

    def __init__(
        self,
        producer: OutboxProducer,
        listener: AsyncTransactionListener | TransactionListener,
        *,
        answer_timeout_s: float = 5.0,
    ) -> None:
        self.producer = producer
        self.listener = listener
        self._checks = producer.set_transaction_listener(
            listener,  # type: ignore[arg-type]  # an async check is awaited by the resolver
            answer_timeout_s=answer_timeout_s,
        )

    async def send_message_in_transaction(
        self,
        msg: Message | Sequence[Message],
        arg: Any = None,
        *,
        check_immunity_s: int | None = None,
    ) -> TransactionSendResult:
        """As :meth:`TransactionalProducer.send_message_in_transaction`, awaited.

        Raises:
            InvalidMessageError: bad input; nothing was sent and the local transaction not run.
            HalfSendError: not acknowledged; the local transaction was not run, and its
                ROLLBACK op was written (as for a cancellation during the send).
            ConfigurationError, ForkedWithLockHeldError: as for
                :meth:`TransactionalProducer.send_message_in_transaction`.
        """
        messages = _messages(msg)
        # The listener's async check_local_transaction runs on this loop (the check endpoint
        # answers from its own thread).
        self.producer.use_loop(asyncio.get_running_loop())
        if self.producer.known_partitions is None:  # read once per producer: blocking
            await asyncio.to_thread(lambda: self.producer.partitions)
        txn = AsyncOutboxTransaction(
            self.producer, check_immunity_s=check_immunity_s, check_by=CheckBy.LISTENER
        )
        halves = [_build(txn.core, m) for m in messages]
        with self._checks.executing(txn.txn_id):
            try:
                coordinates = await txn.send_messages(halves, count=len(halves))
            except BaseException:
                await _not_run_async(txn)
                raise
            if tracing.otel is None:
                state = await self._execute(txn.txn_id, messages[0], arg)
            else:
                run = functools.partial(self._execute, txn.txn_id, messages[0], arg)
                state = await tracing.otel.execute_async(txn.core, run)
            written = await txn.finish(state)
        return TransactionSendResult(SendStatus.SEND_OK, txn.txn_id, state, coordinates, written)

    async def _execute(self, txn_id: str, msg: Message, arg: Any) -> LocalTransactionState:
        execute = self.listener.execute_local_transaction
        try:
            if inspect.iscoroutinefunction(execute):
                with outside():  # its local transaction is its own, not its caller's
                    state: Any = await execute(msg, arg)
            else:
                state = await self._in_thread(txn_id, execute, msg, arg)
                if inspect.isawaitable(state):  # a plain function returning an awaitable
                    with outside():
                        state = await state
        except Exception:
            log.exception(
                "execute_local_transaction of %s raised; state UNKNOWN",
                txn_id,
                extra=fields(txn_id=txn_id),
            )
            return LocalTransactionState.UNKNOWN
        return _checked(txn_id, state)

    async def _in_thread(
        self, txn_id: str, execute: Callable[[Message, Any], Any], msg: Message, arg: Any
    ) -> Any:
        """A plain ``execute_local_transaction`` in a worker thread, marked executing until the
        thread itself ends.

        Cancelled (a client gone, ``asyncio.run`` ending and cancelling every task), the caller
        moves on while the thread goes on and may still commit: its checks answer UNKNOWN until
        it ends, not a ROLLBACK from the listener meanwhile. So the thread lets go of its mark,
        not the task, which may be cancelled again or never resumed; one that never started
        (cancelled before the executor took it) is let go of by its task.
        """
        release = self._checks.hold(txn_id)
        gate = threading.Lock()
        began: list[bool] = []  # [True] once the thread runs it, [False] once dropped

        def run() -> Any:
            with gate:
                if began:
                    return LocalTransactionState.UNKNOWN  # dropped before it began: never ran
                began.append(True)
            try:
                return execute(msg, arg)
            finally:
                release()

        def never_began(_: object) -> None:
            with gate:
                if began:
                    return
                began.append(False)
            release()

        try:
            with outside():  # the thread's context is copied from this one
                running = asyncio.ensure_future(asyncio.to_thread(run))
        except BaseException:
            release()
            raise
        running.add_done_callback(never_began)
        return await asyncio.shield(running)


def _messages(msg: Message | Sequence[Message]) -> list[Message]:
    """The messages of one send, each an :class:`~outbox.Message` (a ``str`` is a sequence
    too: its characters would each be taken for a message).

    Raises:
        InvalidMessageError: none, or something other than Messages, named.
    """
    if isinstance(msg, Message):
        return [msg]
    if isinstance(msg, (str, bytes, bytearray, memoryview)) or not isinstance(msg, Iterable):
        raise InvalidMessageError(
            f"send_message_in_transaction takes an outbox.Message or a list of them, got "
            f"{type(msg).__name__} {msg!r:.80}; wrap it: Message(topic, value, key=...)"
        )
    messages = list(msg)
    if not messages:
        raise InvalidMessageError("send_message_in_transaction needs at least one message")
    for index, each in enumerate(messages):
        if not isinstance(each, Message):
            raise InvalidMessageError(
                f"send_message_in_transaction: message {index} is a {type(each).__name__} "
                f"{each!r:.80}, not an outbox.Message; wrap it: Message(topic, value, key=...)"
            )
    return messages


def _is_async(execute: object) -> bool:
    """A coroutine function, or an object whose ``__call__`` is one."""
    call = inspect.getattr_static(type(execute), "__call__", None)
    return inspect.iscoroutinefunction(execute) or inspect.iscoroutinefunction(call)


def _async_listener_message(listener: object) -> str:
    return (
        f"{type(listener).__qualname__}.execute_local_transaction is async (a coroutine "
        "function, or returned a coroutine), which the synchronous TransactionalProducer cannot "
        "run; use AsyncTransactionalProducer (awaited on your event loop), or make it a plain def"
    )


def _build(txn: OutboxTransaction, m: Message) -> HalfMessage:
    delay = m.delay_level if m.delay_level is not None else m.deliver_at_ms
    return txn.build(m.topic, m.value, m.key, message_headers(m), delay=delay)


def _not_run(txn: OutboxTransaction) -> None:
    """The half send failed or was interrupted, so this transaction's local transaction never
    runs: its ROLLBACK op, naming the records acknowledged (the relay drops every record of the
    transaction by its id, acknowledged or not).

    Without it a record that reached the half topic unacknowledged (a timeout, a lost answer)
    waits for a check, and the listener answers from business data: after the application
    retried the same operation as a new transaction, which committed, that answer is COMMIT and
    the message is delivered twice. (RocketMQ writes no end-transaction when the half send
    throws; the session forms write this ROLLBACK, :mod:`outbox.scope`.) A failure to write the
    op is logged: the checker still decides, as before.
    """
    try:
        txn.finish(LocalTransactionState.ROLLBACK)
    except Exception:
        _op_failed(txn.txn_id)


async def _not_run_async(txn: AsyncOutboxTransaction) -> None:
    """:func:`_not_run` for asyncio."""
    try:
        await txn.finish(LocalTransactionState.ROLLBACK)
    except Exception:
        _op_failed(txn.txn_id)


def _op_failed(txn_id: str) -> None:
    log.exception(
        "the ROLLBACK op of %s, whose half send failed, was not written; the checker decides",
        txn_id,
        extra=fields(txn_id=txn_id),
    )


def _checked(txn_id: str, state: object) -> LocalTransactionState:
    """The listener's answer, or UNKNOWN (logged) when it is not a LocalTransactionState."""
    if not isinstance(state, LocalTransactionState):
        log.error(
            "execute_local_transaction of %s returned %r, not a LocalTransactionState; "
            "treating it as UNKNOWN",
            txn_id,
            state,
            extra=fields(txn_id=txn_id),
        )
        return LocalTransactionState.UNKNOWN
    return state

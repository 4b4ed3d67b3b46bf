"""Checks answered by the application, RocketMQ's way: ``check_local_transaction(message)``.

``TransactionalProducer`` transactions leave no evidence row (their local work is the
listener's own), so a check of one is answered by the group's listener, given the half message
the transaction sent (:class:`~outbox.message.MessageView`, from the check request). What the
application answers is the truth, except where it cannot be:

- while this instance (or a worker forked from it, :mod:`outbox.checks.executing`) is still
  running ``execute_local_transaction`` for the transaction, the answer is UNKNOWN without
  asking (a slow local transaction is not yet a ROLLBACK);
- an exception, a return value that is not a :class:`LocalTransactionState`, no half message in
  the request, or no answer within ``answer_timeout_s`` is UNKNOWN: the check is repeated later,
  never turned into a ROLLBACK.

The application must itself answer UNKNOWN while the local transaction may still commit on
another instance of the group (RocketMQ's rule; ``check_immunity_s`` delays the first check).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

from outbox.checks.executing import ExecutingMarks
from outbox.logs import fields
from outbox.message import MessageView
from outbox.protocol.check import CheckedTransaction
from outbox.protocol.half import HalfRecord
from outbox.protocol.states import LocalTransactionState

State = LocalTransactionState
log = logging.getLogger("outbox.checks")

#: The application's check: a plain function, or a coroutine function (awaited on ``loop``).
CheckFunction = Callable[[MessageView], LocalTransactionState | Awaitable[LocalTransactionState]]


class CheckingListener(Protocol):
    """The half of RocketMQ's ``TransactionListener`` that answers checks."""

    def check_local_transaction(self, msg: MessageView) -> LocalTransactionState:
        """Say how the local transaction of ``msg.transaction_id`` ended: COMMIT, ROLLBACK, or
        UNKNOWN while it may still commit. ``msg`` is the first message the transaction sent,
        read back from the half topic."""
        ...


class FunctionResolver:
    """Answers each check with ``check(message)``; see the module docstring for the rules.

    Args:
        check: the application's ``check_local_transaction``; it receives a
            :class:`~outbox.message.MessageView` (``.transaction_id``, ``.key``, ``.value``, ...).
        answer_timeout_s: how long one batch waits for its answers; the rest are UNKNOWN.
            Defaults to 5 s, half the checker's request timeout.
        max_running: calls that may still be running past their timeout before new checks are
            answered UNKNOWN without a call (a hung lookup must not take a thread per check).

    A coroutine function's answer is awaited on :attr:`loop`, the application's event loop (the
    asyncio producers set it; its database engine's connections belong to it), else on a loop
    of the answering thread's own.
    """

    #: Needs the half messages: values the checker left out are read back first.
    needs_messages = True

    def __init__(
        self,
        check: CheckFunction,
        *,
        answer_timeout_s: float = 5.0,
        max_running: int = 32,
        executing: ExecutingMarks | None = None,
    ) -> None:
        self.check = check
        self.answer_timeout_s = answer_timeout_s
        self.max_running = max_running
        #: The transactions whose checks answer UNKNOWN unasked (:mod:`outbox.checks.executing`).
        self.executing_marks = executing if executing is not None else ExecutingMarks()
        self.executing = self.executing_marks.executing
        self.hold = self.executing_marks.hold
        self._running = 0
        self._lock = threading.Lock()
        #: The event loop an async ``check`` runs on.
        self.loop: asyncio.AbstractEventLoop | None = None

    def resolve(self, checks: Sequence[CheckedTransaction]) -> dict[str, State]:
        answers: dict[str, State] = {}
        pending: dict[str, Future[State]] = {}
        for check in checks:
            early = self._without_asking(check)
            if early is not None:
                answers[check.txn_id] = early
            else:
                assert check.half is not None
                pending[check.txn_id] = self._start(view(check.half, check.check_times))
        deadline = time.monotonic() + self.answer_timeout_s
        for txn_id, future in pending.items():
            try:
                answers[txn_id] = future.result(max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                log.warning(
                    "check_local_transaction gave no answer for %s within %.1f s; UNKNOWN",
                    txn_id,
                    self.answer_timeout_s,
                    extra=fields(txn_id=txn_id),
                )
                answers[txn_id] = State.UNKNOWN
        return answers

    def _without_asking(self, check: CheckedTransaction) -> State | None:
        if check.txn_id in self.executing_marks:
            return State.UNKNOWN  # execute_local_transaction is still running (here or forked)
        with self._lock:
            if self._running >= self.max_running:
                log.error(
                    "%d calls of check_local_transaction are still running past their timeout; "
                    "answering UNKNOWN for %s without asking",
                    self._running,
                    check.txn_id,
                    extra=fields(txn_id=check.txn_id),
                )
                return State.UNKNOWN
        if check.half is None or check.value_omitted:
            log.error(
                "the check of %s carries no half message (a checker older than this producer, "
                "or its value could not be read back); UNKNOWN - upgrade the checker",
                check.txn_id,
                extra=fields(txn_id=check.txn_id),
            )
            return State.UNKNOWN
        return None

    def _start(self, message: MessageView) -> Future[State]:
        """Run one call in a daemon thread: a call that never returns cannot hold up the
        process's exit, and it is counted until it does."""
        future: Future[State] = Future()
        with self._lock:
            self._running += 1

        def call() -> None:
            try:
                future.set_result(self._ask(message))
            finally:
                with self._lock:
                    self._running -= 1

        threading.Thread(target=call, name="outbox-check-answer", daemon=True).start()
        return future

    def _ask(self, message: MessageView) -> State:
        try:
            answer: Any = self.check(message)
            if inspect.isawaitable(answer):
                answer = self._await(answer)
        except Exception:
            log.exception(
                "check_local_transaction raised for %s; UNKNOWN",
                message.transaction_id,
                extra=fields(txn_id=message.transaction_id),
            )
            return State.UNKNOWN
        if not isinstance(answer, State):
            log.error(
                "check_local_transaction returned %r for %s, not a LocalTransactionState; "
                "UNKNOWN - return LocalTransactionState.COMMIT, ROLLBACK or UNKNOWN",
                answer,
                message.transaction_id,
                extra=fields(txn_id=message.transaction_id),
            )
            return State.UNKNOWN
        return answer

    def _await(self, answer: Awaitable[State]) -> State:
        """Run an async check's answer to its end from this (answering) thread."""

        async def run() -> State:
            return await answer

        loop = self.loop
        if loop is None or not loop.is_running():
            # Its engine's connections belong to the application's loop; a loop of our own
            # would leave them bound to a closed one. Asked again once the loop is known.
            close = getattr(answer, "close", None)
            if callable(close):
                close()
            log.warning(
                "an async check_local_transaction has no running event loop yet; UNKNOWN (the "
                "asyncio forms and the ASGI check endpoint give it theirs as they start; with "
                "the threaded endpoint call producer.use_loop(loop), or make the check a plain "
                "def, before the checker's give-up dead-letters these transactions)"
            )
            return State.UNKNOWN
        return asyncio.run_coroutine_threadsafe(run(), loop).result()


def view(half: HalfRecord, check_times: int) -> MessageView:
    """The half message as the application's check sees it."""
    message = half.message
    return MessageView(
        topic=message.topic,
        value=message.value,
        key=message.key,
        headers=message.headers,
        properties=_properties(message.headers),
        transaction_id=half.txn_id,
        producer_group=half.producer_group,
        message_index=half.index,
        message_count=half.count,
        partition=half.partition,
        offset=half.original_offset,
        born_timestamp_ms=half.created_at_ms,
        check_times=check_times,
    )


def _properties(headers: Sequence[tuple[str, bytes]]) -> dict[str, str]:
    """RocketMQ's user properties: the headers whose values are UTF-8 text."""
    found = {}
    for name, value in headers:
        try:
            found[name] = value.decode()
        except UnicodeDecodeError:
            continue
    return found

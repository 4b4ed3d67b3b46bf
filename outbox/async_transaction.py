"""One outbox transaction in asyncio: the same transaction, its sends awaited.

:class:`AsyncOutboxTransaction` drives an :class:`~outbox.transaction.OutboxTransaction`, which
decides what each send produces, the offsets it records and the op that ends the transaction:
the records, the evidence row and the op are those of the synchronous forms. Only the waiting
differs: a half send's acknowledgement is awaited as a future (:mod:`outbox.acks`), the evidence
row is written through ``AsyncSession.run_sync``, and an op the settings say to wait for is
awaited too, so the event loop never blocks on Kafka.

Sends of one transaction run one after another (a lock): the next batch's message indexes follow
the acknowledged ones, so two sends started together (``asyncio.gather``) still number their
messages in order, as in the synchronous forms.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any

from outbox import tracing
from outbox.errors import (
    HalfSendError,
    NoActiveTransactionError,
    SendNotAwaitedError,
    WrongFormError,
)
from outbox.message import Headers, Message, Serializer
from outbox.protocol.half import HalfMessage
from outbox.protocol.states import CheckBy, LocalTransactionState
from outbox.transaction import HalfCoordinates, OutboxTransaction, TransactionHost

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

#: After each send (or while its records travel): the transaction, and whether it was its first.
OnSent = Callable[[OutboxTransaction, bool], Awaitable[None]]


class AsyncOutboxTransaction:
    """Collects half messages (awaited) and, once the local outcome is known, writes the op."""

    def __init__(
        self,
        producer: TransactionHost,
        *,
        on_sent: OnSent | None = None,
        may_send: Callable[[], None] | None = None,
        in_flight: bool = False,
        check_immunity_s: int | None = None,
        check_by: CheckBy = CheckBy.EVIDENCE,
    ) -> None:
        self.core = OutboxTransaction(
            producer,
            may_send=may_send,
            in_flight=in_flight,
            check_immunity_s=check_immunity_s,
            check_by=check_by,
        )
        #: The local transaction's session (decorator and context-manager forms).
        self.session: AsyncSession | None = None
        self._on_sent = on_sent
        self._sending = asyncio.Lock()
        self._closed = False
        #: Sends not run to their end yet: ``outbox.send()`` results (:mod:`outbox.sending`) and
        #: the marks of :meth:`send` / :meth:`send_batch` (:meth:`_tracked`).
        self.unawaited: set[object] = set()

    @property
    def producer(self) -> TransactionHost:
        """The producer that opened it, whose clients and serializers its sends use."""
        return self.core.producer

    @property
    def txn_id(self) -> str:
        return self.core.txn_id

    @property
    def state(self) -> LocalTransactionState | None:
        return self.core.state

    @property
    def coordinates(self) -> HalfCoordinates | None:
        return self.core.coordinates

    def send(
        self,
        topic: str,
        value: Any,
        key: Any = None,
        headers: Headers | None = None,
        *,
        serializer: Serializer | None = None,
        key_serializer: Serializer | None = None,
        delay: Any = None,
    ) -> Coroutine[Any, Any, HalfCoordinates]:
        """Send one half message: await the result (its acknowledgement).

        The message is validated now; the send runs when the result is awaited (or run as a
        task). One never awaited sends nothing, and the transaction refuses to commit without
        it (:class:`~outbox.errors.SendNotAwaitedError`), as ``outbox.send()`` does.

        Raises:
            InvalidMessageError: bad input (a specific subclass); nothing was sent.
            HalfSendError: (awaited) Kafka did not acknowledge it; the transaction must not
                commit.
            TransactionFencedError: (awaited) a check fenced this transaction id (first send
                only).
        """
        self.refuse_outside_a_loop("txn.send()")
        message = self.core.build(
            topic,
            value,
            key,
            headers,
            serializer=serializer,
            key_serializer=key_serializer,
            delay=delay,
        )
        return self._tracked([message])

    def send_batch(
        self,
        messages: Iterable[Message],
        *,
        serializer: Serializer | None = None,
        key_serializer: Serializer | None = None,
    ) -> Coroutine[Any, Any, HalfCoordinates]:
        """Send several half messages at once: await the result (all their acknowledgements,
        awaited together). Validated now, sent when awaited, refused at the COMMIT if never
        awaited (:meth:`send`).

        Raises:
            InvalidMessageError: a bad message (a specific subclass); nothing was sent.
            HalfSendError: (awaited) Kafka did not acknowledge them; the transaction must not
                commit.
        """
        self.refuse_outside_a_loop("txn.send_batch()")
        return self._tracked(self.build_batch(messages, serializer, key_serializer))

    def refuse_outside_a_loop(self, what: str) -> None:
        """Refuse a send (``what`` names the call) from a thread with no event loop running: a
        worker thread given a copy of the task's context (``asyncio.to_thread``, a FastAPI
        ``def`` endpoint under an ``async def`` dependency) sees the transaction, but nothing
        there could await the send, which the COMMIT would otherwise refuse as never awaited.

        Raises:
            WrongFormError: naming the call and the fix.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise WrongFormError(
                f"{what} was called in asyncio transaction {self.txn_id} from a thread with no "
                "running event loop (asyncio.to_thread, a thread pool, a FastAPI `def` endpoint "
                "under an `async def` dependency); an asyncio transaction's sends are awaited on "
                f"its loop: make the caller `async def` and `await {what[:-2]}(...)`"
            ) from None

    def _tracked(self, messages: list[HalfMessage]) -> Coroutine[Any, Any, HalfCoordinates]:
        """The send of ``messages`` as a coroutine, counted in :attr:`unawaited` until it ran:
        a coroutine never awaited runs none of its body, so only a mark made before it exists
        can tell the COMMIT that a send was left behind."""
        mark = object()
        self.unawaited.add(mark)

        async def sending() -> HalfCoordinates:
            try:
                return await self.send_messages(messages, count=None)
            finally:  # run to its end (a send still under way is not yet done)
                self.unawaited.discard(mark)

        return sending()

    def build_batch(
        self,
        messages: Iterable[Message],
        serializer: Serializer | None = None,
        key_serializer: Serializer | None = None,
    ) -> list[HalfMessage]:
        """Validate and serialize messages without sending them (see
        :meth:`OutboxTransaction.build_batch`)."""
        return self.core.build_batch(messages, serializer, key_serializer)

    def build(
        self,
        topic: Any,
        value: Any,
        key: Any = None,
        headers: Headers | None = None,
        *,
        serializer: Serializer | None = None,
        key_serializer: Serializer | None = None,
        delay: Any = None,
    ) -> HalfMessage:
        """Validate and serialize a message without sending it."""
        return self.core.build(
            topic,
            value,
            key,
            headers,
            serializer=serializer,
            key_serializer=key_serializer,
            delay=delay,
        )

    async def send_messages(
        self, messages: list[HalfMessage], count: int | None
    ) -> HalfCoordinates:
        """Send validated messages as one batch (``count`` known: all of the transaction's)."""
        if tracing.otel is not None:  # a span, its context carried in the messages' headers
            return await tracing.otel.send_async(self.core, messages, count, self._send_messages)
        return await self._send_messages(messages, count)

    async def _send_messages(
        self, messages: list[HalfMessage], count: int | None
    ) -> HalfCoordinates:
        try:
            await self._sending.acquire()
        except BaseException as err:
            # Cancelled while it waited for another send (a timeout, a task cancelled): its
            # message was never sent, and code that catches the cancellation goes on as if it
            # had been; the COMMIT must not carry the rest without it.
            unsent = HalfSendError(
                f"a send of {len(messages)} message(s) was interrupted ({err!r}) while it "
                "waited for another send of the transaction; none of them was sent"
            )
            unsent.__cause__ = err
            self.core.broke(unsent)
            raise
        try:
            if self._closed:
                late = NoActiveTransactionError(
                    f"transaction {self.txn_id} is ending: a send started after its block "
                    "returned or raised (a task left running?) is refused; send inside its scope"
                )
                # A send queued for the lock before the block ended: close() waits behind it, so
                # the COMMIT that follows must know a message it was meant to carry is missing.
                self.core.broke(late)
                raise late
            batch = self.core.batch(messages, count)
            failed: list[Exception] = []
            try:
                offsets = await self.core.producer.kafka.send_halves_async(
                    batch, meanwhile=self._while_sending(failed) if self.core.in_flight else None
                )
                coordinates = self.core.acknowledged(offsets)
                if failed:
                    raise failed[0]
                if not self.core.in_flight:
                    await self._sent()
            except BaseException as err:  # cancelled too: its records may be on the topic
                self.core.broke(err)
                raise
            return coordinates
        finally:
            self._sending.release()

    async def _sent(self) -> None:
        """After a send, or while its records travel: the evidence row with the first, then
        the session's watch (:meth:`OutboxTransaction._sent`)."""
        if self._on_sent is not None:
            await self._on_sent(self.core, not self.core.evidence_written)
            self.core.evidence_written = True

    def _while_sending(self, failed: list[Exception]) -> Callable[[], Awaitable[None]]:
        """:meth:`_sent` while the records travel, what it raises kept for after their
        acknowledgement (:meth:`OutboxTransaction._while_sending`)."""

        async def sent() -> None:
            try:
                await self._sent()
            except Exception as err:
                failed.append(err)

        return sent

    async def close(self) -> None:
        """No send starts from now on, and one under way (another task's) finishes first, its
        acknowledgement and evidence row included: the commit or rollback that follows covers
        every record this transaction handed to Kafka."""
        self._closed = True
        async with self._sending:
            pass

    def check_awaited(self) -> None:
        """Raise, before the commit, when a send of this transaction (``outbox.send()``,
        :meth:`send`, their batch forms) was never awaited (its message never sent), or a send
        failed (:meth:`OutboxTransaction.check_whole`).

        Raises:
            SendNotAwaitedError: naming how many.
            HalfSendError, TransactionFencedError: a send failed and the code went on.
        """
        self.core.check_whole()
        if self.unawaited:
            raise SendNotAwaitedError(
                f"transaction {self.txn_id}: {len(self.unawaited)} send(s) in this "
                "asyncio transaction (outbox.send(), txn.send() or their batch forms) were never "
                "awaited, so their messages were never sent; write `await outbox.send(...)` or "
                "`await txn.send(...)`. The transaction is rolled back"
            )

    async def finish(self, state: LocalTransactionState) -> bool:
        """Record the local outcome; write the op for COMMIT/ROLLBACK when halves were sent.

        Returns:
            True when an op record was written (or none was needed).
        """
        op = self.core.conclude(state)
        if op is None:
            return state is not LocalTransactionState.UNKNOWN
        if tracing.otel is not None:
            return await tracing.otel.op_async(op, self.core.producer.kafka.send_op_async)
        return await self.core.producer.kafka.send_op_async(op)

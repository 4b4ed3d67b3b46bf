"""``outbox.send()`` and ``outbox.send_batch()``: a message in the current transaction, whichever
form runs it.

Inside a synchronous transaction the call hands the records to Kafka; where the evidence row is
written while they travel (PostgreSQL) it returns then, the caller's code goes on, and the
acknowledgement is awaited before the COMMIT (or at the next send, or when the result's
``coordinates`` are read): the caller's own writes overlap Kafka's round trip. On SQLite, and in a
traced send (its span covers the acknowledgement), it waits before it returns.

Inside an asyncio transaction it returns at once and the send runs when the result is awaited
(``await outbox.send(...)``): the caller's task waits, the event loop does not. So both
forms write ``outbox.send(...)``, and the asyncio one awaits it. A send that is never awaited
sends nothing, and the transaction refuses to commit without it
(:class:`~outbox.errors.SendNotAwaitedError`): a message the code meant to send is never dropped
silently.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Generator, Iterable, Sequence
from typing import Any

from outbox import tracing
from outbox.async_transaction import AsyncOutboxTransaction
from outbox.errors import NoActiveTransactionError
from outbox.left_scopes import abandoned
from outbox.message import Headers, Message, Serializer
from outbox.nesting import current
from outbox.protocol.half import HalfMessage
from outbox.transaction import HalfCoordinates, OutboxTransaction

Start = Callable[[], Coroutine[Any, Any, HalfCoordinates]]


class Sending:
    """What ``outbox.send()`` returns: awaited, the coordinates of the transaction's half records
    (an asyncio transaction sends then; a synchronous one had sent already)."""

    def __init__(
        self,
        done: HalfCoordinates | None = None,
        *,
        start: Start | None = None,
        txn: AsyncOutboxTransaction | None = None,
        settle: Callable[[], HalfCoordinates] | None = None,
    ) -> None:
        self._done = done
        self._start = start
        self._settle = settle
        self._txn = txn
        if txn is not None:
            txn.unawaited.add(self)

    @property
    def coordinates(self) -> HalfCoordinates:
        """Where the half records are (a synchronous send; an asyncio one once awaited).

        Raises:
            NoActiveTransactionError: an asyncio send not awaited yet.
            HalfSendError: a synchronous send's records were not acknowledged.
        """
        if self._settle is not None:
            self._done = self._settle()  # a failed send raises on every read
            self._settle = None
        if self._done is None:
            raise NoActiveTransactionError(
                "this asyncio send has not run yet: `await outbox.send(...)` first"
            )
        return self._done

    def __await__(self) -> Generator[Any, None, HalfCoordinates]:
        if self._settle is not None:  # a synchronous send awaited: where its records are
            return self.coordinates
        if self._start is not None:
            start, self._start = self._start, None
            try:
                self._done = yield from start().__await__()
            finally:  # awaited to its end (a send still under way is not yet done)
                if self._txn is not None:
                    self._txn.unawaited.discard(self)
        if self._done is None:
            raise NoActiveTransactionError("this send is already being awaited elsewhere")
        return self._done


def send(
    topic: str,
    value: Any,
    key: Any = None,
    headers: Headers | None = None,
    *,
    serializer: Serializer | None = None,
    key_serializer: Serializer | None = None,
    delay: Any = None,
) -> Sending:
    """Send a half message in the current transaction (see :meth:`OutboxTransaction.send`);
    in an asyncio transaction, ``await`` it.

    ``serializer`` / ``key_serializer`` may be confluent-kafka serializers (``AvroSerializer``,
    ``JSONSerializer``, ...): their context names ``topic``, so schemas are registered under the
    real topic's subjects (:mod:`outbox.serialization`).

    Raises:
        NoActiveTransactionError: called outside ``@transactional`` / ``producer.transaction()``.
    """
    txn = current_transaction()
    # validated now in either form: a bad message fails where it is sent
    message = txn.build(
        topic,
        value,
        key,
        headers,
        serializer=serializer,
        key_serializer=key_serializer,
        delay=delay,
    )
    if isinstance(txn, AsyncOutboxTransaction):
        txn.refuse_outside_a_loop("outbox.send()")
        return Sending(start=lambda: txn.send_messages([message], count=None), txn=txn)
    return _started(txn, [message])


def send_batch(
    messages: Iterable[Message],
    *,
    serializer: Serializer | None = None,
    key_serializer: Serializer | None = None,
) -> Sending:
    """Send several half messages in the current transaction, waiting once for all of them
    (see :meth:`OutboxTransaction.send_batch`); in an asyncio transaction, ``await`` it.

    Raises:
        NoActiveTransactionError: called outside ``@transactional`` / ``producer.transaction()``.
    """
    txn = current_transaction()
    built = txn.build_batch(messages, serializer, key_serializer)  # validated now, as send()
    if isinstance(txn, AsyncOutboxTransaction):
        txn.refuse_outside_a_loop("outbox.send_batch()")
        return Sending(start=lambda: txn.send_messages(built, count=None), txn=txn)
    return _started(txn, built)


def _started(txn: OutboxTransaction, messages: list[HalfMessage]) -> Sending:
    """A synchronous send: handed to Kafka now, acknowledged by the COMMIT at the latest
    (:meth:`OutboxTransaction.start_messages`). A traced send's span covers the
    acknowledgement, so that one waits here."""
    otel = tracing.otel
    carried: Sequence[HalfMessage] = messages
    if otel is not None:
        if otel.configured():
            return Sending(txn.send_messages(messages, count=None))
        carried = otel.carried(messages)  # a caller's context goes on without a span
    upto = txn.start_messages(carried, count=None)
    return Sending(settle=lambda: txn.sent_coordinates(upto))


def current_transaction() -> OutboxTransaction | AsyncOutboxTransaction:
    """The transaction this code runs in.

    Raises:
        NoActiveTransactionError: there is none.
    """
    txn = current.get()
    if txn is None or abandoned(txn):  # left: see outbox.left_scopes
        raise NoActiveTransactionError(
            "outbox.send() was called outside a transaction; call it inside a function decorated "
            "with @outbox.transactional or inside `with producer.transaction(...)` (`async with` "
            "for an AsyncSession). A transaction is current only in the context that opened it: "
            "code that runs in another thread or context (a thread pool, a FastAPI dependency "
            "written as a plain `def`, which opens it in a worker thread of its own) sends with "
            "the transaction object itself, `txn.send(...)`"
        )
    return txn

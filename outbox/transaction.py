"""One outbox transaction: its id, its half messages, and the op that ends it.

The three public forms (decorator, context manager, RocketMQ-style producer) all drive this
class; they differ only in how they run the local transaction. Their asyncio forms drive it too
(:class:`outbox.async_transaction.AsyncOutboxTransaction`): what a send produces, which offsets
it records and which op ends the transaction are decided here once, for both.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from outbox import tracing
from outbox.errors import (
    HalfSendError,
    InvalidMessageError,
    NoActiveTransactionError,
    TransactionFencedError,
    TransactionTooLargeError,
)
from outbox.half_sender import HalfBatch, PendingHalves
from outbox.kafka_io import KafkaIO
from outbox.message import Headers, Message, Serializer, build_half_message, message_headers
from outbox.protocol.half import HalfMessage, check_immunity
from outbox.protocol.ids import new_transaction_id
from outbox.protocol.op import OpRecord
from outbox.protocol.partitioning import partition_for
from outbox.protocol.record_size import refuse_oversized
from outbox.protocol.states import CheckBy, DecidedBy, LocalTransactionState, OpState

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from outbox.settings import OutboxSettings
    from outbox.witnesses import CommitWitnesses

log = logging.getLogger("outbox")


class TransactionHost(Protocol):
    """What a transaction needs of the producer that opened it (:class:`outbox.OutboxProducer`):
    named here so this module does not import the producer, which imports it."""

    settings: OutboxSettings
    serializer: Serializer | None
    key_serializer: Serializer | None
    witnesses: CommitWitnesses

    @property
    def kafka(self) -> KafkaIO: ...

    @property
    def partitions(self) -> int: ...

    @property
    def known_partitions(self) -> int | None: ...


@dataclass(frozen=True)
class HalfCoordinates:
    """Where a transaction's half records are: one partition, offsets in message order."""

    partition: int
    offsets: tuple[int, ...]


class OutboxTransaction:
    """Collects half messages and, once the local outcome is known, writes the op record."""

    def __init__(
        self,
        producer: TransactionHost,
        *,
        on_sent: Callable[[OutboxTransaction, bool], None] | None = None,
        may_send: Callable[[], None] | None = None,
        in_flight: bool = False,
        check_immunity_s: int | None = None,
        check_by: CheckBy = CheckBy.EVIDENCE,
    ) -> None:
        self.producer = producer
        self.txn_id = new_transaction_id()
        self.partition: int | None = None
        self.offsets: list[int] = []
        self.state: LocalTransactionState | None = None
        #: The local transaction's session (decorator and context-manager forms).
        self.session: Session | None = None
        self._on_sent = on_sent
        #: Asked before each send's records are built; raises to refuse the send (the
        #: session's database transaction ended under it: :mod:`outbox.session_guard`).
        self._may_send = may_send
        #: Whether ``on_sent`` runs while a send's records travel (see :meth:`_sent`) rather
        #: than once they are acknowledged.
        self.in_flight = in_flight
        self._check_immunity_s = check_immunity(check_immunity_s)
        self._check_by = check_by
        #: Whether the evidence row is written (with the first send).
        self.evidence_written = False
        #: Why this transaction cannot commit any more: a send that failed after its records
        #: were handed to Kafka, or whose evidence row was not written (see :meth:`check_whole`).
        self.broken: BaseException | None = None
        #: The last send's records while their acknowledgement is still to be awaited
        #: (:meth:`start_messages`), with what ``on_sent`` raised meanwhile.
        self._pending: tuple[PendingHalves, list[Exception]] | None = None
        #: Set once the COMMIT is under way: a send from then on (a session event's, during
        #: the flush the COMMIT starts with) is awaited before it returns (:meth:`committing`).
        self._committing = False
        #: Sends and their settling, one at a time (a context copied into another thread).
        self._lock = threading.RLock()

    @property
    def coordinates(self) -> HalfCoordinates | None:
        if self.partition is None:
            return None
        return HalfCoordinates(self.partition, tuple(self.offsets))

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
    ) -> HalfCoordinates:
        """Send one half message now and wait for its acknowledgement.

        ``serializer`` / ``key_serializer`` (default: the producer's) turn a value / key into
        bytes: a one-argument callable, or confluent-kafka's ``serializer(obj, ctx)`` protocol
        with the real topic in the context (:mod:`outbox.serialization`). Without a
        ``key_serializer``, a one-argument ``serializer`` serializes the key too.

        Raises:
            InvalidMessageError: bad input (a specific subclass); nothing was sent.
            HalfSendError: Kafka did not acknowledge it; the transaction must not commit.
            TransactionFencedError: a check fenced this transaction id (first send only).
            ForkedWithLockHeldError: this process was forked with a lock held that its Kafka
                clients need (:mod:`outbox.fork_checks`); nothing was sent.
        """
        message = self.build(
            topic,
            value,
            key,
            headers,
            serializer=serializer,
            key_serializer=key_serializer,
            delay=delay,
        )
        return self.send_messages([message], count=None)

    def send_batch(
        self,
        messages: Iterable[Message],
        *,
        serializer: Serializer | None = None,
        key_serializer: Serializer | None = None,
    ) -> HalfCoordinates:
        """Send several half messages at once and wait once for all their acknowledgements:
        one round trip instead of one per message. Their indexes follow the order given.

        Raises:
            InvalidMessageError: a bad message (a specific subclass); nothing was sent.
            HalfSendError: Kafka did not acknowledge them; the transaction must not commit.
            ForkedWithLockHeldError: as :meth:`send`.
        """
        built = self.build_batch(messages, serializer, key_serializer)
        return self.send_messages(built, count=None)

    def build_batch(
        self,
        messages: Iterable[Message],
        serializer: Serializer | None = None,
        key_serializer: Serializer | None = None,
    ) -> list[HalfMessage]:
        """Validate and serialize messages without sending them.

        Raises:
            InvalidMessageError: a bad message (a specific subclass), or none at all.
        """
        built = [
            self.build(
                m.topic,
                m.value,
                m.key,
                message_headers(m),
                serializer=serializer,
                key_serializer=key_serializer,
                delay=m.delay_level if m.delay_level is not None else m.deliver_at_ms,
            )
            for m in messages
        ]
        if not built:
            raise InvalidMessageError("send_batch needs at least one message")
        return built

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
        self._check_open()
        settings = self.producer.settings
        return build_half_message(
            topic=topic,
            value=value,
            key=key,
            headers=headers,
            names=settings.topics,
            max_bytes=settings.max_message_bytes,
            serializer=serializer or self.producer.serializer,
            key_serializer=key_serializer or self.producer.key_serializer,
            delay=delay,
        )

    def send_messages(self, messages: Sequence[HalfMessage], count: int | None) -> HalfCoordinates:
        """Send validated messages as one batch (``count`` known: all of the transaction's)."""
        if tracing.otel is not None:  # a span, its context carried in the messages' headers
            return tracing.otel.send(self, messages, count, self._send_messages)
        return self._send_messages(messages, count)

    def _send_messages(self, messages: Sequence[HalfMessage], count: int | None) -> HalfCoordinates:
        self.start_messages(messages, count)
        return self.settle()

    def start_messages(self, messages: Sequence[HalfMessage], count: int | None) -> int:
        """Hand validated messages to Kafka as one batch; their acknowledgement is awaited by
        :meth:`settle` - before the COMMIT, at the next send, or when the caller asks where they
        are - so the caller's own writes overlap the records' round trip.

        Only a transaction that writes its evidence row while the records travel
        (``in_flight``) leaves the wait for later; otherwise the row follows the
        acknowledgement, and this waits for it now. A previous send's records are awaited
        first: one batch at a time, since a batch's indexes follow those acknowledged before it.

        Returns:
            How many half records the transaction has once this send is acknowledged (for
            :meth:`sent_coordinates`).

        Raises:
            HalfSendError, TransactionFencedError: as :meth:`send` (the send, or the evidence
                row written while it travelled, failed; or the send before it, awaited first).
        """
        with self._lock:
            self._await_pending()
            batch = self.batch(messages, count)
            failed: list[Exception] = []
            kafka = self.producer.kafka
            try:
                if self.in_flight:
                    pending = kafka.start_halves(batch, meanwhile=self._while_sending(failed))
                else:
                    pending = PendingHalves.done(kafka.send_halves(batch))
            except BaseException as err:
                self.broke(err)
                raise
            self._pending = (pending, failed)
            # the evidence row not written, or the COMMIT already under way: no later wait
            if failed or not self.in_flight or self._committing:
                self._await_pending()
            return batch.first_index + len(batch.messages)

    def settle(self, *, retry: bool = True) -> HalfCoordinates:
        """Await the acknowledgement of the records :meth:`start_messages` handed to Kafka;
        where the transaction's half records are (those of every send so far). ``retry=False``
        awaits only the attempt under way (a ROLLBACK's op needs to know where the records
        are, not to send them again).

        Raises:
            HalfSendError, TransactionFencedError: the send failed (the transaction is broken
                and must not commit).
            NoActiveTransactionError: nothing was sent yet.
        """
        with self._lock:
            if self._pending is not None:
                (pending, failed), self._pending = self._pending, None
                try:
                    coordinates = self.acknowledged(pending.settle(retry=retry))
                    if failed:
                        raise failed[0]
                    if not self.in_flight:
                        self._sent()
                except BaseException as err:
                    self.broke(err)
                    raise
                return coordinates
            if self.partition is None:
                raise NoActiveTransactionError(f"transaction {self.txn_id} has sent nothing yet")
            return HalfCoordinates(self.partition, tuple(self.offsets))

    def sent_coordinates(self, upto: int) -> HalfCoordinates:
        """Where a send's records are, read after it returned (``outbox.send(...).coordinates``):
        the transaction's first ``upto`` half records (this send's and those before it),
        awaited if they are still travelling.

        Raises:
            HalfSendError, TransactionFencedError: this send failed (on every read).
        """
        with self._lock:
            if len(self.offsets) < upto:
                self._await_pending()
            if len(self.offsets) < upto:  # it failed, when this or a later step awaited it
                assert self.broken is not None
                raise self.broken
            assert self.partition is not None
            return HalfCoordinates(self.partition, tuple(self.offsets[:upto]))

    def committing(self) -> None:
        """The COMMIT begins: await every send so far, and any send from now on (a session
        event's, in the flush the COMMIT starts with) before it returns, so that no record the
        COMMIT covers is still unacknowledged when the database commits.

        Raises:
            HalfSendError, TransactionFencedError: a send failed.
        """
        with self._lock:
            self._committing = True
            self._await_pending()

    def _await_pending(self, *, retry: bool = True) -> None:
        """:meth:`settle`, when a send is still travelling."""
        if self._pending is not None:
            self.settle(retry=retry)

    @property
    def settled(self) -> bool:
        """Whether every record handed to Kafka has been acknowledged (or failed)."""
        return self._pending is None

    def _sent(self) -> None:
        """After a send, or while its records travel (``in_flight``): the evidence row with the
        first, then the session's watch. In flight, the INSERT's round trip and Kafka's overlap
        instead of adding up, and it stays safe: a send that then fails breaks the transaction,
        which rolls the row back with everything else (:meth:`check_whole`)."""
        if self._on_sent is not None:
            self._on_sent(self, not self.evidence_written)
            self.evidence_written = True

    def _while_sending(self, failed: list[Exception]) -> Callable[[], None]:
        """:meth:`_sent` while the records travel; what it raises (a fence: the evidence row's
        key taken) waits in ``failed`` for their acknowledgement, so the ROLLBACK op that
        follows names their offsets and the relay drops them as soon as it reads it."""

        def sent() -> None:
            try:
                self._sent()
            except Exception as err:
                failed.append(err)

        return sent

    def broke(self, err: BaseException) -> None:
        """A send failed after its records were handed to Kafka (they may be there), or its
        evidence row was not written: this transaction must not commit, even if the caller
        caught the error and went on."""
        if self.broken is None:
            self.broken = err

    def check_whole(self) -> None:
        """Raise, before the commit, when a send of this transaction failed.

        Raises:
            HalfSendError, TransactionFencedError (the failure's own kind): naming it.
        """
        err = self.broken
        if err is None:
            return
        message = (
            f"transaction {self.txn_id} cannot commit: a send of it failed ({err!r}) and the "
            "code went on; its messages may be partly on the half topic and its evidence row "
            "missing, so the outbox rolls it back - retry the business operation as a new "
            "transaction"
        )
        kind = type(err) if isinstance(err, HalfSendError | TransactionFencedError) else None
        raise (kind or HalfSendError)(message) from err

    def batch(self, messages: Sequence[HalfMessage], count: int | None) -> HalfBatch:
        """The next half records to send: on the transaction's partition (chosen by the first
        message's key), indexed after those acknowledged so far. One batch at a time: the next
        one's indexes depend on this one's acknowledgement.

        Raises:
            NoActiveTransactionError: the transaction already ended.
            TransactionTooLargeError: the transaction would pass
                ``max_messages_per_transaction``; nothing of ``messages`` was sent.
            MessageTooLargeError: a message's record would pass ``max_record_bytes``.
            TransactionEndedError: the session's database transaction ended under it.
        """
        self._check_open()
        if self._may_send is not None:
            self._may_send()
        limit = self.producer.settings.max_messages_per_transaction
        if len(self.offsets) + len(messages) > limit:
            raise TransactionTooLargeError(
                f"transaction {self.txn_id} would have {len(self.offsets) + len(messages)} "
                f"messages; one transaction can send at most {limit}: its op record names every "
                "message's offset and must fit in one Kafka record (librdkafka's "
                "message.max.bytes and the op topic's max.message.bytes). Nothing of this send "
                "was sent; split the work over several transactions"
            )
        settings = self.producer.settings
        refuse_oversized(
            messages,
            limit=settings.max_record_bytes,
            producer_group=settings.producer_group,
            schema_version=settings.half_schema_version,
            check_by=self._check_by,
        )
        if self.partition is None:
            self.partition = self._choose_partition(messages[0])
        return HalfBatch(
            txn_id=self.txn_id,
            partition=self.partition,
            first_index=len(self.offsets),
            messages=messages,
            count=count,
            check_immunity_s=self._check_immunity_s,
            check_by=self._check_by,
        )

    def acknowledged(self, offsets: Sequence[int]) -> HalfCoordinates:
        """Kafka acknowledged the last batch at ``offsets``."""
        assert self.partition is not None
        self.offsets += offsets
        return HalfCoordinates(self.partition, tuple(self.offsets))

    def _choose_partition(self, message: HalfMessage) -> int:
        key = message.key if message.key is not None else self.txn_id.encode()
        return partition_for(key, self.producer.partitions)

    def finish(self, state: LocalTransactionState) -> bool:
        """Record the local outcome; write the op for COMMIT/ROLLBACK when halves were sent.

        Returns:
            True when an op record was written (or none was needed).
        """
        op = self.conclude(state)
        if op is None:
            return state is not LocalTransactionState.UNKNOWN
        if tracing.otel is not None:
            return tracing.otel.op(op, self.producer.kafka.send_op)
        return self.producer.kafka.send_op(op)

    def conclude(self, state: LocalTransactionState) -> OpRecord | None:
        """Record the local outcome; the op that tells it, or None when there is nothing to
        tell (no half sent, or the outcome is UNKNOWN: the checker finds it out)."""
        with self._lock:  # a send from another thread finishes (and settles) first
            if not self.settled:
                if state is not LocalTransactionState.ROLLBACK:  # never: the COMMIT settled first
                    raise AssertionError(f"transaction {self.txn_id} ends {state} mid-send")
                # a ROLLBACK after a send still travelling (the code raised meanwhile): the
                # attempt under way first, so the op names its records and the relay drops them
                try:
                    self._await_pending(retry=False)
                except Exception:  # the send failed too: the op names what was acknowledged
                    log.debug("transaction %s: a send failed before its ROLLBACK", self.txn_id)
            self.state = state
        if self.partition is None or state is LocalTransactionState.UNKNOWN:
            return None
        return OpRecord(
            txn_id=self.txn_id,
            state=OpState(state.value),
            producer_group=self.producer.settings.producer_group,
            half_partition=self.partition,
            half_offsets=tuple(self.offsets),
            decided_by=DecidedBy.PRODUCER,
            decided_at_ms=int(time.time() * 1000),
        )

    def _check_open(self) -> None:
        if self.state is not None:
            raise NoActiveTransactionError(
                f"transaction {self.txn_id} already ended ({self.state.value}); "
                "send inside the transaction's scope"
            )

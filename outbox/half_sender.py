"""Half records of one send handed to librdkafka, their acknowledgement awaited - at once, later
(:meth:`HalfSender.start`: the transaction's own work overlaps the round trip) or as an asyncio
future - and a failed attempt retried (``send_attempts``).

A sender waits only for its own records: each batch has a :class:`~outbox.acks.Waiter` its
delivery reports complete (served by :class:`~outbox.kafka_io.KafkaIO`'s poll thread, or
resolved on the event loop with ``loop.call_soon_threadsafe`` in asyncio). Each attempt is
measured from its records handed to librdkafka to their acknowledgement, and each failed one
counted by its reason, when the producer has metrics (:mod:`outbox.metrics`; without
prometheus_client that costs an ``is None`` check).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from confluent_kafka import KafkaError, Producer
from tenacity import RetryError, Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from outbox.acks import Waiter, backoff_s, future_setter
from outbox.errors import HalfSendError
from outbox.kafka_permissions import grant_hint
from outbox.logs import fields
from outbox.metrics import ProducerMetrics
from outbox.protocol.half import HalfMessage, encode_half_headers
from outbox.protocol.states import CheckBy
from outbox.settings import OutboxSettings

log = logging.getLogger("outbox")


@dataclass(frozen=True)
class HalfBatch:
    """The half records of one send: same transaction, same partition."""

    txn_id: str
    partition: int
    first_index: int
    messages: Sequence[HalfMessage]
    count: int | None
    check_immunity_s: int | None = None
    check_by: str = CheckBy.EVIDENCE


class HalfSender:
    """Sends the half records of a producer group through ``producer()`` (librdkafka's handle;
    a closed producer's raises :class:`~outbox.errors.ProducerClosedError`)."""

    def __init__(
        self,
        settings: OutboxSettings,
        producer: Callable[[], Producer],
        metrics: ProducerMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self._producer = producer

    def send(self, batch: HalfBatch, meanwhile: Callable[[], None] | None = None) -> list[int]:
        """Send and await the batch; its offsets in order.

        ``meanwhile`` runs once, after the first attempt whose records are all handed to
        librdkafka, before their acknowledgement is awaited: the transaction's evidence row is
        inserted while the records travel, so the database's round trip and Kafka's overlap
        instead of adding up. What it raises is raised (its records may still be acknowledged;
        the transaction is broken either way and must not commit).

        Raises:
            HalfSendError: not acknowledged after ``send_attempts`` attempts.
        """
        return self.start(batch, meanwhile).settle()

    def start(self, batch: HalfBatch, meanwhile: Callable[[], None] | None = None) -> PendingHalves:
        """:meth:`send` up to the wait: the records handed to librdkafka and
        ``meanwhile`` run; the returned handle's ``settle()`` awaits the acknowledgement (and
        the retries, as :meth:`send`), so the caller can do other work while the records
        travel."""
        todo = [] if meanwhile is None else [meanwhile]
        started = 0.0 if self.metrics is None else time.perf_counter()
        try:
            waiter = self._produce_batch(batch)
        except HalfSendError as err:  # not handed over (a full queue): the retries go now, so
            self._count_failed(err)  # that ``meanwhile`` runs within this call as ever
            return PendingHalves.done(self._retry_halves(batch, err, todo))
        while todo:  # once: popped before it runs
            todo.pop()()
        return PendingHalves(lambda retry: self._settle_once(batch, waiter, started, todo, retry))

    def _settle_once(
        self,
        batch: HalfBatch,
        waiter: Waiter,
        started: float,
        todo: list[Callable[[], None]],
        retry: bool,
    ) -> list[int]:
        try:
            return self._acknowledged(batch, waiter, started)
        except HalfSendError as err:
            if not retry:
                raise
            return self._retry_halves(batch, err, todo)

    def _retry_halves(
        self, batch: HalfBatch, err: HalfSendError, todo: list[Callable[[], None]]
    ) -> list[int]:
        """The attempts after a failed first one (tenacity's machinery costs tens of us per
        call, so the first attempt goes without it)."""
        if self.settings.send_attempts <= 1 or not _retriable(err):
            raise err
        _retrying(batch, err)
        time.sleep(0.1)
        try:
            for attempt in Retrying(
                stop=stop_after_attempt(self.settings.send_attempts - 1),
                wait=wait_exponential(multiplier=0.1, max=2),
                retry=retry_if_exception(_retriable),
                reraise=True,
            ):
                with attempt:
                    return self._send_once(batch, todo)
        except RetryError as failed:  # pragma: no cover - reraise=True makes this unreachable
            raise HalfSendError(str(failed)) from failed
        raise AssertionError("unreachable")

    async def send_async(
        self, batch: HalfBatch, meanwhile: Callable[[], Awaitable[None]] | None = None
    ) -> list[int]:
        """:meth:`send` for asyncio: the same records and retries, the acknowledgement
        awaited without blocking the loop; ``meanwhile`` is awaited once while the first
        attempt's records travel (:meth:`send`).

        Raises:
            HalfSendError: not acknowledged after ``send_attempts`` attempts.
        """
        todo = [] if meanwhile is None else [meanwhile]
        attempt = 1
        while True:
            try:
                return await self._send_once_async(batch, todo)
            except HalfSendError as err:
                if attempt >= self.settings.send_attempts or not _retriable(err):
                    raise
                _retrying(batch, err)
            await asyncio.sleep(backoff_s(attempt))
            attempt += 1

    async def _send_once_async(
        self, batch: HalfBatch, todo: list[Callable[[], Awaitable[None]]]
    ) -> list[int]:
        metrics = self.metrics
        started = 0.0 if metrics is None else time.perf_counter()
        try:
            acknowledged: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            waiter = self._produce_batch(batch, on_done=future_setter(acknowledged))
            while todo:  # once: popped before it runs
                await todo.pop()()
            try:
                await asyncio.wait_for(acknowledged, self.settings.send_timeout_s + 5)
            except TimeoutError:
                raise self._unacknowledged(batch) from None
            offsets = self._outcome(batch, waiter)
        except HalfSendError as err:
            if metrics is not None:
                metrics.half_failed(err.reason)
            raise
        if metrics is not None:
            metrics.half_acknowledged(waiter.done_at - started)
        return offsets

    def _send_once(self, batch: HalfBatch, todo: list[Callable[[], None]]) -> list[int]:
        """One attempt; ``todo`` (what the sender does while the records travel) is emptied
        once they are all handed over, so it runs with exactly one attempt."""
        started = 0.0 if self.metrics is None else time.perf_counter()
        try:
            waiter = self._produce_batch(batch)
        except HalfSendError as err:
            self._count_failed(err)
            raise
        while todo:  # once: popped before it runs
            todo.pop()()
        return self._acknowledged(batch, waiter, started)

    def _acknowledged(self, batch: HalfBatch, waiter: Waiter, started: float) -> list[int]:
        """Await the attempt's acknowledgement; its offsets, or the failure (counted)."""
        try:
            if not waiter.done.wait(self.settings.send_timeout_s + 5):
                raise self._unacknowledged(batch)
            offsets = self._outcome(batch, waiter)
        except HalfSendError as err:
            self._count_failed(err)
            raise
        if self.metrics is not None:
            self.metrics.half_acknowledged(waiter.done_at - started)
        return offsets

    def _count_failed(self, err: HalfSendError) -> None:
        if self.metrics is not None:
            self.metrics.half_failed(err.reason)

    def _produce_batch(self, batch: HalfBatch, on_done: Callable[[], None] | None = None) -> Waiter:
        """Hand the batch's records to librdkafka (which only queues them)."""
        waiter = Waiter(len(batch.messages), on_done)
        now_ms = int(time.time() * 1000)
        topic = self.settings.topics.half
        for i, message in enumerate(batch.messages):
            headers: list[tuple[str, str | bytes | None]] = encode_half_headers(  # type: ignore[assignment]
                txn_id=batch.txn_id,
                producer_group=self.settings.producer_group,
                message=message,
                index=batch.first_index + i,
                count=batch.count,
                created_at_ms=now_ms,
                check_immunity_s=batch.check_immunity_s,
                schema_version=self.settings.half_schema_version,
                check_by=batch.check_by,
            )
            self._produce(topic, batch.txn_id.encode(), message.value, headers, batch, waiter, i)
        return waiter

    def _unacknowledged(self, batch: HalfBatch) -> HalfSendError:
        return HalfSendError(
            f"half message(s) of transaction {batch.txn_id} not acknowledged within "
            f"{self.settings.send_timeout_s} s; is Kafka at "
            f"{self.settings.bootstrap_servers} up?",
            reason=HalfSendError.TIMEOUT,
        )

    def _outcome(self, batch: HalfBatch, waiter: Waiter) -> list[int]:
        if waiter.errors:
            error = waiter.errors[0]
            topic = self.settings.topics.half
            raise HalfSendError(
                f"half message(s) of transaction {batch.txn_id} refused by topic {topic}: "
                f"{error.str()}{grant_hint(error, topic)}",
                error,
                reason=HalfSendError.REFUSED,
            )
        offsets = [o for o in waiter.offsets if o is not None]
        if len(offsets) < len(waiter.offsets):
            # Delivered, but where? librdkafka reports a produce it retried and the broker had
            # already written (its first answer lost to a leader change: DUPLICATE_SEQUENCE_NUMBER
            # on the retry) as delivered at an unknown offset. A COMMIT naming fewer records
            # than were sent would deliver less than the transaction committed, so this attempt
            # failed: the batch goes again, and the copies of this one stay unnamed (as after a
            # timeout) - the relay and the checker never deliver a record no op names.
            raise HalfSendError(
                f"half message(s) of transaction {batch.txn_id} acknowledged without an offset "
                f"({len(waiter.offsets) - len(offsets)} of {len(waiter.offsets)}: a produce "
                "librdkafka retried and the broker already had); no op could name them, so the "
                "attempt failed (retried up to send_attempts)",
                reason=HalfSendError.ERROR,
            )
        return offsets

    def _produce(
        self,
        topic: str,
        key: bytes,
        value: bytes | None,
        headers: list[tuple[str, str | bytes | None]],
        batch: HalfBatch,
        waiter: Waiter,
        i: int,
    ) -> None:
        try:
            self._producer().produce(
                topic,
                value=value,
                key=key,
                headers=headers,
                partition=batch.partition,
                on_delivery=waiter.callback(i),
            )
        except BufferError as err:
            raise HalfSendError(
                f"the producer's local queue is full: {err}", reason=HalfSendError.QUEUE_FULL
            ) from err
        except Exception as err:  # KafkaException from produce(): e.g. unknown partition
            kafka_error = err.args[0] if err.args and isinstance(err.args[0], KafkaError) else None
            raise HalfSendError(
                f"cannot send a half message to {topic}: {err}{grant_hint(kafka_error, topic)}",
                kafka_error,
            ) from err


class PendingHalves:
    """Half records handed to Kafka whose acknowledgement is awaited later
    (:meth:`HalfSender.start`); the transaction settles each once."""

    def __init__(self, settle: Callable[[bool], list[int]]) -> None:
        self._settle = settle

    @classmethod
    def done(cls, offsets: list[int]) -> PendingHalves:
        """A send already acknowledged at ``offsets``."""
        return cls(lambda retry: offsets)

    def settle(self, *, retry: bool = True) -> list[int]:
        """The offsets, once acknowledged; ``retry=False`` awaits only the attempt under way
        (a transaction rolling back needs to know where its records are, not to send them
        again).

        Raises:
            HalfSendError: not acknowledged (after ``send_attempts`` attempts with ``retry``).
        """
        return self._settle(retry)


def _retrying(batch: HalfBatch, err: HalfSendError) -> None:
    log.warning(
        "half send of transaction %s failed (%s); retrying",
        batch.txn_id,
        err,
        extra=fields(txn_id=batch.txn_id, partition=batch.partition),
    )


def _retriable(err: BaseException) -> bool:
    if not isinstance(err, HalfSendError):
        return False
    return err.kafka_error is None or bool(err.kafka_error.retriable())

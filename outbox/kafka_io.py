"""The producer's Kafka side: half records sent and awaited, op records sent best-effort
(:mod:`outbox.op_writer`).

Two librdkafka producers (idempotent, ``acks=all``) serve every thread: one for half records, which
a sender waits for (``linger.ms`` 1: no wait for company), and one for op records, which nobody
waits for by default (``op_linger_ms``, 0 by default: they go out at once, and batch behind the
requests in flight under load). The asyncio forms (:meth:`KafkaIO.send_halves_async`) produce the
same way and await their acknowledgement as a future, resolved from the delivery callback's thread
with ``loop.call_soon_threadsafe``: librdkafka's ``produce()`` only enqueues, so nothing here
blocks an event loop. A Kafka request costs the process some 350 us of CPU (a third of a small
transaction's SQL through SQLAlchemy), so under load fewer requests leave more of the core to the
transactions. A background thread per producer serves delivery callbacks, so a sender waits only
for its own records, not for everybody's (``flush()`` would).

Each half send attempt is measured from its records handed to librdkafka to their
acknowledgement, and each failed one counted by its reason, when the producer has metrics
(:mod:`outbox.metrics`; without prometheus_client that costs an ``is None`` check).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from confluent_kafka import KafkaError, Producer
from tenacity import RetryError, Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from outbox.acks import Waiter, backoff_s, future_setter
from outbox.errors import HalfSendError, KafkaOperationError, ProducerClosedError
from outbox.kafka_logging import log_to_python
from outbox.logs import fields
from outbox.metrics import ProducerMetrics
from outbox.op_writer import OpWriter
from outbox.protocol.half import HalfMessage, encode_half_headers
from outbox.protocol.op import OpRecord
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


class KafkaIO:
    """Sends half and op records for one producer group; ``metrics`` (None without
    prometheus_client) counts them."""

    def __init__(self, settings: OutboxSettings, metrics: ProducerMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        config = {
            "bootstrap.servers": settings.bootstrap_servers,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 1,
            "message.timeout.ms": int(settings.send_timeout_s * 1000),
            **settings.kafka,
        }
        self._producer: Producer | None = Producer(log_to_python(config))
        self._op_producer: Producer | None = Producer(
            log_to_python({**config, "linger.ms": settings.op_linger_ms})
        )
        self._closed = threading.Event()
        #: The op records (:mod:`outbox.op_writer`).
        self.ops = OpWriter(settings, lambda: self._ops, self._closed, metrics)
        self._pollers = [
            threading.Thread(target=self._poll, args=(p,), name=name, daemon=True)
            for p, name in (
                (self._producer, "outbox-kafka-poll"),
                (self._op_producer, "outbox-kafka-op-poll"),
            )
        ]
        for poller in self._pollers:
            poller.start()

    @property
    def _p(self) -> Producer:
        if self._producer is None:
            raise ProducerClosedError("this outbox producer is closed; create a new one")
        return self._producer

    @property
    def _ops(self) -> Producer:
        if self._op_producer is None:
            raise ProducerClosedError("this outbox producer is closed; create a new one")
        return self._op_producer

    @property
    def ops_sent(self) -> int:
        """Op records the broker took since this producer started."""
        return self.ops.sent

    @property
    def ops_failed(self) -> int:
        """Op records not written since this producer started (the checker decides those)."""
        return self.ops.failed

    def _poll(self, producer: Producer) -> None:
        while not self._closed.is_set():
            try:
                producer.poll(0.05)
            except Exception:  # a delivery report's handler raised (confluent-kafka passes it
                # on from poll): this thread must go on, or no later report would be served
                log.exception("a delivery report's handler failed; serving the next ones")

    def send_halves(
        self, batch: HalfBatch, meanwhile: Callable[[], None] | None = None
    ) -> list[int]:
        """Send and await the batch; its offsets in order.

        ``meanwhile`` runs once, after the first attempt whose records are all handed to
        librdkafka, before their acknowledgement is awaited: the transaction's evidence row is
        inserted while the records travel, so the database's round trip and Kafka's overlap
        instead of adding up. What it raises is raised (its records may still be acknowledged;
        the transaction is broken either way and must not commit).

        Raises:
            HalfSendError: not acknowledged after ``send_attempts`` attempts.
        """
        self._check_open()
        todo = [] if meanwhile is None else [meanwhile]
        try:  # the first attempt without tenacity's machinery (tens of us per call)
            return self._send_once(batch, todo)
        except HalfSendError as err:
            if self.settings.send_attempts <= 1 or not _retriable(err):
                raise
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
        except RetryError as err:  # pragma: no cover - reraise=True makes this unreachable
            raise HalfSendError(str(err)) from err
        raise AssertionError("unreachable")

    async def send_halves_async(
        self, batch: HalfBatch, meanwhile: Callable[[], Awaitable[None]] | None = None
    ) -> list[int]:
        """:meth:`send_halves` for asyncio: the same records and retries, the acknowledgement
        awaited without blocking the loop; ``meanwhile`` is awaited once while the first
        attempt's records travel (:meth:`send_halves`).

        Raises:
            HalfSendError: not acknowledged after ``send_attempts`` attempts.
        """
        self._check_open()
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
        metrics = self.metrics
        started = 0.0 if metrics is None else time.perf_counter()
        try:
            waiter = self._produce_batch(batch)
            while todo:  # once: popped before it runs
                todo.pop()()
            if not waiter.done.wait(self.settings.send_timeout_s + 5):
                raise self._unacknowledged(batch)
            offsets = self._outcome(batch, waiter)
        except HalfSendError as err:
            if metrics is not None:
                metrics.half_failed(err.reason)
            raise
        if metrics is not None:
            metrics.half_acknowledged(waiter.done_at - started)
        return offsets

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
            raise HalfSendError(
                f"half message(s) of transaction {batch.txn_id} refused: {error.str()}",
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
            self._p.produce(
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
            raise HalfSendError(f"cannot send a half message: {err}", kafka_error) from err

    def send_op(self, op: OpRecord) -> bool:
        """Send an op record; False (logged, counted) when it failed (:meth:`OpWriter.send`).
        Failure is never raised: the transaction is already decided in the database, and the
        checker resolves it from there."""
        return self.ops.send(op)

    async def send_op_async(self, op: OpRecord) -> bool:
        """:meth:`send_op` for asyncio: an op waited for is awaited without blocking the loop
        (:meth:`OpWriter.send_async`); a one-way one goes through :meth:`send_op`."""
        if not self.settings.wait_for_op or self._closed.is_set():
            return self.send_op(op)
        return await self.ops.send_async(op)

    def partitions(self) -> int:
        """Partition count of the half topic, as the broker reports it."""
        self._check_open()
        topic = self.settings.topics.half
        try:
            # All topics, not just ours: asking for one by name may auto-create it with 1 partition.
            metadata = self._p.list_topics(timeout=self.settings.send_timeout_s)
        except Exception as err:
            raise HalfSendError(f"cannot read metadata of {topic}: {err}") from err
        found = metadata.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            raise KafkaOperationError(
                f"internal topic {topic} does not exist; run outbox.ensure_topics(settings) "
                "(or `outbox topics ensure`) first"
            )
        return len(found.partitions)

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise ProducerClosedError("this outbox producer is closed; create a new one")

    def close(self, timeout: float = 10.0) -> None:
        if self._closed.is_set():
            return
        deadline = time.monotonic() + timeout
        self._p.flush(timeout)
        self._ops.flush(max(0.0, deadline - time.monotonic()))
        self._closed.set()
        for poller in self._pollers:
            poller.join()
        # librdkafka's handles and their threads go with the objects
        self._producer = self._op_producer = None

    @property
    def closed(self) -> bool:
        return self._closed.is_set()


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

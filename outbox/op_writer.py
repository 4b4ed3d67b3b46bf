"""Op records: the local outcome told to Kafka, best-effort.

An op is sent once the database has decided (committed or rolled back), so its failure is never
raised: the decision is already in the database, and the checker finds it there through the
check endpoint. A failed op is counted (:attr:`OpWriter.failed`, and
``outbox_producer_ops_failed_total``) and logged with the transaction's id, half partition and
offsets as fields (:func:`outbox.logs.fields`).

One-way by default, as RocketMQ's end-transaction: the op is queued and its delivery report
counts it later, on librdkafka's poll thread; with ``wait_for_op`` the caller waits up to
``op_timeout_s`` (the asyncio form awaits it without blocking its loop).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from confluent_kafka import KafkaError, Message, Producer

from outbox.acks import Waiter, future_setter
from outbox.kafka_permissions import grant_hint
from outbox.logs import fields
from outbox.metrics import ProducerMetrics
from outbox.protocol.op import OpRecord, encode_op
from outbox.protocol.states import OpState
from outbox.settings import OutboxSettings

log = logging.getLogger("outbox")


class OpWriter:
    """Sends the op records of one producer group and counts what became of them.

    Args:
        settings: the topic, ``wait_for_op`` and ``op_timeout_s``.
        producer: returns the librdkafka producer for ops (raises once the producer is closed).
        closed: set when the producer is closed: an op after that is not sent (counted).
        metrics: counts ops written and failed; None without prometheus_client.
    """

    def __init__(
        self,
        settings: OutboxSettings,
        producer: Callable[[], Producer],
        closed: threading.Event,
        metrics: ProducerMetrics | None = None,
    ) -> None:
        self.settings = settings
        self._producer = producer
        self._closed = closed
        self.metrics = metrics
        #: Ops the broker took, and ops not written, since the producer started.
        self.sent = 0
        self.failed = 0

    def send(self, op: OpRecord) -> bool:
        """Send an op record; False (logged, counted) when it failed.

        True means queued (one-way), or acknowledged with ``wait_for_op``.
        """
        if self._closed.is_set():
            return self._failed(op, "producer closed")
        key, value = encode_op(op)
        if not self.settings.wait_for_op:
            return self._produce(op, key, value, None)
        waiter = Waiter(1)
        if not self._produce(op, key, value, waiter):
            return False
        if not waiter.done.wait(self.settings.op_timeout_s):
            return self._failed(op, f"no acknowledgement within {self.settings.op_timeout_s} s")
        return self._outcome(op, waiter)

    async def send_async(self, op: OpRecord) -> bool:
        """:meth:`send` for asyncio: with ``wait_for_op`` the acknowledgement is awaited
        without blocking the loop; otherwise the same one-way send."""
        if not self.settings.wait_for_op or self._closed.is_set():
            return self.send(op)
        key, value = encode_op(op)
        acknowledged: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = Waiter(1, future_setter(acknowledged))
        if not self._produce(op, key, value, waiter):
            return False
        try:
            await asyncio.wait_for(acknowledged, self.settings.op_timeout_s)
        except TimeoutError:
            return self._failed(op, f"no acknowledgement within {self.settings.op_timeout_s} s")
        return self._outcome(op, waiter)

    def _produce(self, op: OpRecord, key: bytes, value: bytes, waiter: Waiter | None) -> bool:
        """Queue the op; False (counted) when librdkafka refused it at once."""
        try:
            self._producer().produce(
                self.settings.topics.op,
                key=key,
                value=value,
                partition=op.half_partition,
                on_delivery=waiter.callback(0) if waiter else self._delivered(op),
            )
        except Exception as err:
            return self._failed(op, repr(err), err)
        return True

    def _outcome(self, op: OpRecord, waiter: Waiter) -> bool:
        if waiter.errors:
            return self._failed(op, waiter.errors[0].str(), waiter.errors[0])
        self._written(op)
        return True

    def _delivered(self, op: OpRecord) -> Callable[[KafkaError | None, Message], None]:
        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is None:
                self._written(op)
            else:
                self._failed(op, err.str(), err)

        return on_delivery

    def _written(self, op: OpRecord) -> None:
        self.sent += 1
        if self.metrics is not None:
            _counted(self.metrics.op_written, op)

    def _failed(
        self, op: OpRecord, why: str, error: KafkaError | BaseException | None = None
    ) -> bool:
        self.failed += 1
        if self.metrics is not None:
            _counted(self.metrics.op_failed, op)
        log.warning(
            "op %s for transaction %s not written (%s%s); the checker will resolve it",
            op.state.value,
            op.txn_id,
            why,
            grant_hint(error, self.settings.topics.op),
            extra=fields(txn_id=op.txn_id, partition=op.half_partition, offsets=op.half_offsets),
        )
        return False


def _counted(count: Callable[[OpState], None], op: OpRecord) -> None:
    """``count(op.state)``, never raising: it runs after the transaction committed, in the
    caller's thread (waiting for the op) or in the poller that serves every later delivery
    report; a metrics backend that fails must cost the count, not the caller or the poller."""
    try:
        count(op.state)
    except Exception:
        log.exception("counting op %s of transaction %s failed", op.state.value, op.txn_id)

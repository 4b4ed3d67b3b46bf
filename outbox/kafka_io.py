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

How a half send's records are handed over, awaited (now, later, or in asyncio), retried and
measured is :mod:`outbox.half_sender`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable

from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import ClusterMetadata  # type: ignore[attr-defined]

from outbox import kafka_clients
from outbox.errors import (
    HalfSendError,
    KafkaOperationError,
    ProducerClosedError,
    TopicMismatchError,
)
from outbox.half_sender import HalfBatch, HalfSender, PendingHalves
from outbox.metrics import ProducerMetrics
from outbox.op_writer import OpWriter
from outbox.protocol.op import OpRecord
from outbox.protocol.topics import TopicNames
from outbox.settings import OutboxSettings, variable
from outbox.topic_metadata import read_topic_metadata, transient

log = logging.getLogger("outbox")


class KafkaIO:
    """Sends half and op records for one producer group; ``metrics`` (None without
    prometheus_client) counts them."""

    def __init__(self, settings: OutboxSettings, metrics: ProducerMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        config = {
            "bootstrap.servers": settings.bootstrap_servers,
            "linger.ms": 1,
            "message.timeout.ms": int(settings.send_timeout_s * 1000),
            **settings.kafka,
            # last, whatever ``kafka`` says (its settings refuse weaker values): the guarantee
            "enable.idempotence": True,
            "acks": "all",
        }
        self._producer: Producer | None = kafka_clients.producer(config)
        self._op_producer: Producer | None = kafka_clients.producer(
            {**config, "linger.ms": settings.op_linger_ms}
        )
        self._closed = threading.Event()
        #: The half records (:mod:`outbox.half_sender`).
        self.halves = HalfSender(settings, lambda: self._p, metrics)
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
        """Send and await the batch; its offsets in order (:meth:`HalfSender.send`).

        Raises:
            HalfSendError: not acknowledged after ``send_attempts`` attempts.
        """
        self._check_open()
        return self.halves.send(batch, meanwhile)

    def start_halves(
        self, batch: HalfBatch, meanwhile: Callable[[], None] | None = None
    ) -> PendingHalves:
        """Hand the batch to librdkafka; its acknowledgement is awaited later
        (:meth:`HalfSender.start`)."""
        self._check_open()
        return self.halves.start(batch, meanwhile)

    async def send_halves_async(
        self, batch: HalfBatch, meanwhile: Callable[[], Awaitable[None]] | None = None
    ) -> list[int]:
        """:meth:`send_halves` for asyncio (:meth:`HalfSender.send_async`).

        Raises:
            HalfSendError: not acknowledged after ``send_attempts`` attempts.
        """
        self._check_open()
        return await self.halves.send_async(batch, meanwhile)

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
        """Partition count of the half topic, as the broker reports it.

        Raises:
            KafkaOperationError: the half or op topic does not exist (or this client may not
                describe it), or the broker reported an error for its metadata.
            TopicMismatchError: they have different partition counts. A transaction's op goes
                to the partition of its half records, and a relay or checker handles only the
                partitions both topics have: transactions on the others would never be
                promoted or checked (one of the topics grown by hand).
        """
        self._check_open()
        names = self.settings.topics
        settings = self.settings
        try:  # a dropped connection is tried again within send_timeout_s (outbox.topic_metadata)
            metadata = read_topic_metadata(
                self._p, settings.send_timeout_s, what=settings.bootstrap_servers
            )
        except Exception as err:
            self._check_open()  # closed meanwhile: that is the error to report
            kafka_error = err.args[0] if err.args and isinstance(err.args[0], KafkaError) else None
            if not transient(kafka_error):
                raise HalfSendError(
                    f"cannot read metadata of {names.half}: {err}", kafka_error
                ) from err
            raise HalfSendError(
                f"cannot read metadata of {names.half} within send_timeout_s "
                f"({settings.send_timeout_s:g} s): {err}; check that Kafka at "
                f"{settings.bootstrap_servers} ({variable('bootstrap_servers')}) is up and "
                f"reachable from this process, or give a slow one more "
                f"{variable('send_timeout_s')}",
                kafka_error,
            ) from err
        return internal_partitions(metadata, names)

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


def internal_partitions(metadata: ClusterMetadata, names: TopicNames) -> int:
    """The half topic's partition count, from a listing of every topic the client may see.

    A topic missing from that listing does not exist or is hidden from this client: a broker
    with ACLs lists only the topics the client may Describe. A topic listed with an error (a
    leader election, a topic being created or deleted) exists, and "create it" would be the
    wrong fix, so its error is named instead, as ``kafka_error``.
    """
    counts = {}
    for topic in (names.half, names.op):
        found = metadata.topics.get(topic)
        if found is not None and found.error is not None:
            raise KafkaOperationError(
                f"the broker reported {found.error.name()} for internal topic {topic} "
                f"({found.error.str()}); a retriable error passes once the cluster settles "
                "(retry the transaction), any other needs the operator",
                found.error,
            )
        if found is None or not found.partitions:
            raise KafkaOperationError(
                f"internal topic {topic} does not exist; run outbox.ensure_topics(settings) "
                "(or `kafka-outbox topics ensure`) first. If it exists, this client may not "
                "see it (a broker with ACLs lists only the topics a principal may Describe): "
                "grant the producer's principal Describe and Write on the half and op topics"
            )
        counts[topic] = len(found.partitions)
    if counts[names.half] != counts[names.op]:
        raise TopicMismatchError(
            f"{names.half} has {counts[names.half]} partitions and {names.op} has "
            f"{counts[names.op]}: they must be equal (a transaction's op goes to the "
            "partition of its half records, and relays and checkers handle only the "
            "partitions both topics have). The counts are fixed for good: start a fresh "
            "topic_prefix and keep a relay and a checker on this one until "
            '`kafka-outbox status` shows nothing pending (README "Topics"); nothing was sent'
        )
    return counts[names.half]

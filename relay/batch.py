"""One batch = one Kafka transaction.

Each batch holds what every partition's state hands out - promotions, put-back copies, dead
letters - and the relay's progress on the half and op partitions, committed with
``send_offsets_to_transaction`` and the consumer group's metadata, so an instance that lost its
partitions in a rebalance is fenced and cannot commit. Either all of it commits, or none of it
happened: the Kafka transaction is aborted and the session starts over, its partitions rebuilt
from the committed progress.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import NoReturn

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from prometheus_client import Histogram

from outbox.broker_clock import BrokerClock
from outbox.fetch import HalfFetcher
from outbox.service_health import Health
from outbox.watermarks import Watermarks
from relay.accounting import Accounting
from relay.actions import Batch, Need
from relay.commit_token import CommitTokens, stamped, unstamped
from relay.log_ends import LogEnds
from relay.partitions import Committed, Partitions
from relay.refusals import Refusals, Topics
from relay.restart import Restart
from relay.settings import RelaySettings
from relay.state import PartitionState
from relay.tracing import promoting
from relay.writer import Writer

log = logging.getLogger("relay")


def retried(what: str, call: Callable[[], object], attempts: int = 3) -> None:
    """librdkafka's contract for transactional calls: a retriable failure (a timeout while
    the coordinator moves or loads) is retried, not answered by dropping the producer."""
    for attempt in range(attempts):
        try:
            call()
            return
        except KafkaException as err:
            error = err.args[0]
            if not error.retriable() or attempt == attempts - 1:
                raise
            log.warning("%s: %s; retrying", what, error)


class BatchCommitter:
    """Takes each partition's batch and commits them all in one Kafka transaction."""

    def __init__(
        self,
        settings: RelaySettings,
        partitions: Partitions,
        *,
        producer: Producer,
        consumer: Consumer,
        fetcher: HalfFetcher,
        watermarks: Watermarks,
        topics: Topics,
        writer: Writer,
        refusals: Refusals,
        ends: LogEnds,
        accounting: Accounting,
        health: Health,
        commit_seconds: Histogram,
        clock: BrokerClock,
        tokens: CommitTokens | None = None,
        committed: Callable[[], None] = lambda: None,
    ) -> None:
        """``committed``: called after each Kafka transaction committed (readiness:
        :meth:`relay.readiness.GroupReadiness.committed`)."""
        self.settings = settings
        self.names = settings.topics
        self.partitions = partitions
        self.producer = producer
        self.consumer = consumer
        self.fetcher = fetcher
        self.watermarks = watermarks
        self.writer = writer
        self.refusals = refusals
        self.ends = ends
        self.accounting = accounting
        self.health = health
        self.committed = committed
        self.commit_seconds = commit_seconds
        self.clock = clock
        #: Stamps each Kafka transaction's committed progress (:mod:`relay.commit_token`).
        self.tokens = tokens or CommitTokens()
        self._promotable = functools.partial(refusals.promotable, topics)
        self._still_parked = functools.partial(refusals.still_parked, topics)

    def commit(self, timeout: float | None = None) -> None:
        """Commit what every partition can do now, and its progress, in one Kafka transaction.

        Raises:
            Restart: the Kafka transaction failed and was aborted (or could not be).
        """
        if not self.partitions.states:
            return
        self.refusals.begin_batch()
        for state in self.partitions.states.values():
            state.begin_batch()
        batches = {p: self._take(p, state) for p, state in self.partitions.states.items()}
        committed = self.partitions.committed
        todo = {
            p: b for p, b in batches.items() if b.actions or not _unchanged(b, committed.get(p))
        }
        if not todo:
            self.accounting.count_committed()
            return
        timeout = timeout or self.settings.transaction_timeout_s
        group_metadata = self.membership()
        token = self.tokens.next()
        progress = {
            p: (b.half_offset, b.op_offset, stamped(b.metadata, token)) for p, b in todo.items()
        }
        started = time.monotonic()
        self.writer.begin()
        with promoting(todo):  # spans linked to the promoted transactions' producers
            try:
                self.producer.begin_transaction()
                for p, batch in todo.items():
                    for action in batch.actions:
                        self.writer.emit(self.producer, p, action)
                self._send_offsets(self._offsets(progress), group_metadata, timeout)
                self._commit(timeout)
            except KafkaException as err:
                self._failed(err.args[0], timeout)
        self.commit_seconds.observe(time.monotonic() - started)
        committed.update(progress)
        self.accounting.count_committed()
        self.committed()

    def _take(self, partition: int, state: PartitionState) -> Batch:
        """The partition's batch, once every record it needs was read back by offset."""
        while True:
            result = state.take(
                self.clock.now_ms(),  # the records' clock: a host's ahead puts back early
                put_back_after_ms=int(self.settings.put_back_after_s * 1000),
                log_end=self.ends.log_end(self.consumer, partition),
                verified_end=self.ends.verified_end(
                    self.consumer, self.watermarks, partition, state
                ),
                promotable=self._promotable,
                still_parked=self._still_parked,
                unmovable=self.writer.unmovable,
            )
            if isinstance(result, Batch):
                return result
            assert isinstance(result, Need)
            state.supply(
                result.txn_id, self.fetcher.fetch(partition, result.offsets, result.txn_id)
            )

    def _offsets(self, progress: dict[int, Committed]) -> list[TopicPartition]:
        return [
            tp
            for p, (half, op, metadata) in progress.items()
            for tp in (
                TopicPartition(self.names.half, p, half),
                TopicPartition(self.names.op, p, op, metadata=metadata),
            )
        ]

    def membership(self) -> object:
        """The consumer group metadata the batch's offsets are committed with.

        Raises:
            Restart: this instance is no longer a member of the group. A member taken out of
                the group (its session timed out: frozen, paused, partitioned away) has its
                member id and generation reset by librdkafka, and the broker accepts a
                transactional offset commit without them: a zombie would not be fenced. The
                metadata is taken before the check, so a removal after it leaves the old
                generation in it, which the broker refuses.
        """
        metadata = self.consumer.consumer_group_metadata()
        if not self.consumer.memberid():
            raise Restart("no longer a member of the consumer group: this batch is not written")
        return metadata

    def _send_offsets(
        self, offsets: list[TopicPartition], metadata: object, timeout: float
    ) -> None:
        producer = self.producer
        retried(
            "send_offsets_to_transaction",
            lambda: producer.send_offsets_to_transaction(offsets, metadata, timeout),
        )

    def _commit(self, timeout: float) -> None:
        producer = self.producer
        retried("commit_transaction", lambda: producer.commit_transaction(timeout))

    def _failed(self, error: KafkaError, timeout: float) -> NoReturn:
        """A batch failed: abort it, park what a real topic refused, and start again from the
        committed progress (always raises :class:`Restart`)."""
        self.accounting.aborts += 1
        # said at once: the abort may wait up to ``timeout`` before the session ends
        self.health.set_ready(False, f"last Kafka transaction failed: {error.str()}")
        try:
            if error.fatal():
                raise Restart(f"Kafka transaction failed: {error.str()}")
            required = error.txn_requires_abort()
            if required:
                log.warning(
                    "Kafka transaction aborted (%s); redoing from the committed offsets", error
                )
            # Also where not required: a producer dropped with a transaction open leaves the
            # broker to time it out while a new session starts over.
            try:
                self.producer.abort_transaction(timeout)
            except KafkaException as err:
                if required:
                    raise Restart(f"abort_transaction failed: {err}") from err
            # Redo it in a new session rather than with this producer: a new one bumps the
            # producer epoch (init_transactions), so nothing left of the aborted transaction on
            # the broker - after a broker restart its view and the client's can differ - can
            # ever be completed by a later commit of the same epoch.
            raise Restart(f"Kafka transaction {'aborted' if required else 'failed'}: {error.str()}")
        finally:
            # every way out, after the abort (if any) settled the batch
            self.refusals.park(self.writer.refused(self.producer))


def _unchanged(batch: Batch, committed: Committed | None) -> bool:
    """Whether ``batch`` would commit the progress already committed (its token aside)."""
    return (
        committed is not None
        and committed[0] == batch.half_offset
        and committed[1] == batch.op_offset
        and unstamped(committed[2]) == batch.metadata
    )

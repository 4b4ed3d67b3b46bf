"""The relay: promotes committed half messages to their real topics, exactly once.

Each batch is ONE Kafka transaction holding the promoted records, the put-back copies, the dead
letters, and the relay's progress on the half and op partitions (``send_offsets_to_transaction``
with the consumer group's metadata, so an instance that lost its partitions in a rebalance is
fenced and cannot commit). A ``read_committed`` consumer of a real topic therefore sees each
committed message once, whatever happens to relays and brokers: either the batch committed with
its progress, or neither happened and the batch is redone from the committed progress.

Instances in one consumer group share the partitions. Both topics are subscribed with the range
assignor and have equal partition counts, so one instance owns partition p of both.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from outbox.errors import OutboxError, ProtocolError
from outbox.fetch import HalfFetcher
from outbox.protocol.dead_letter import DeadLetterHeader
from outbox.protocol.half import HalfRecord, copy_headers, decode_half
from outbox.protocol.op import OpRecord, decode_op, encode_op
from outbox.service_http import ServiceEndpoint
from relay.metrics import RelayMetrics
from relay.promotion import Outgoing, dead_letter, promoted
from relay.rebuild import OpHistory, rebuild
from relay.settings import RelaySettings
from relay.state import (
    Action,
    BadRecord,
    Batch,
    Counters,
    Drop,
    Need,
    PartitionState,
    Progress,
    Promote,
    PutBack,
    Reject,
)
from relay.topic_cache import TopicCache

log = logging.getLogger("relay")

#: An op waiting this long for its half records makes the relay ask the broker whether they
#: can exist at all (an op naming offsets past the partition's end is rejected).
VERIFY_AFTER_S = 5.0
#: How often the loop measures its lag for ``/metrics``.
LAG_EVERY_S = 2.0
#: Errors that refuse a record for what it is, so that its transaction is parked. Any other
#: (a broker restarting, a timeout, records the abort dropped) fails the batch alone, which is
#: redone: parking those would let later transactions on the same key overtake.
_REFUSALS = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_MSG,
        KafkaError.INVALID_TIMESTAMP,
        KafkaError.POLICY_VIOLATION,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
    }
)


def refuses_the_record(error: KafkaError) -> bool:
    """Whether ``error`` refuses a record for what it is (its transaction gets parked)."""
    return error.code() in _REFUSALS


def _retried(what: str, call: Callable[[], object], attempts: int = 3) -> None:
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


class _Restart(Exception):
    """The Kafka clients cannot go on (fenced, fatal error): start a new session."""


class Relay:
    """One relay instance: ``run()`` blocks until ``close()``."""

    def __init__(self, settings: RelaySettings) -> None:
        self.settings = settings
        self.names = settings.topics
        self._half = self.names.half
        self.states: dict[int, PartitionState] = {}
        self.aborts = 0
        self.sessions = 0
        self.metrics = RelayMetrics(self)
        self._closed = threading.Event()
        self._committed: dict[int, tuple[int, int, str]] = {}
        #: States let go at the last revoke, with what this instance had committed for them:
        #: kept if the next assignment gives them back with nothing committed by others since.
        self._retained: dict[int, tuple[PartitionState, tuple[int, int, str] | None]] = {}
        #: The state counters as of each partition's last committed Kafka transaction.
        self._counted: dict[str, int] = dict.fromkeys(vars(Counters()), 0)
        self._refused: dict[str, float] = {}  # txn id -> when a real topic refused it
        # Refused transactions due for a retry, as seen by this batch; the next batch retries
        # the longest refused of them, alone (see _why_not).
        self._due: dict[str, float] = {}
        self._retry: str | None = None
        self._waiting_since: dict[int, float] = {}
        self._paused: set[int] = set()
        self._parked_logged: set[str] = set()
        self._copies_end: dict[int, int] = {}
        self._callback_error: Exception | None = None
        self._lag: dict[tuple[str, int], int] = {}
        self._lag_at = 0.0
        #: (half partitions, op partitions) of the last assignment, as the group gave them.
        self.assigned: tuple[frozenset[int], frozenset[int]] = (frozenset(), frozenset())
        self._failures: list[tuple[str | None, str]] = []
        #: Dead letters refused for what they carry, by source (topic, partition, offset):
        #: written again without the original key, value and headers.
        self._letters_refused: dict[tuple[str, int, int], str] = {}
        #: Transactions whose put-back copies the half topic refused (too large once the
        #: origin header is added): never put back; they stay pending where they are.
        self._unmovable: set[str] = set()
        self._loop_at = time.monotonic()
        self._ready = (False, "starting")
        self._http: ServiceEndpoint | None = None
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None

    # -- life cycle ------------------------------------------------------------------------

    def run(self) -> None:
        if self.settings.http_port and self._http is None:
            self._http = ServiceEndpoint(
                live=self.live,
                ready=self.ready,
                metrics=self.metrics.render,
                host=self.settings.http_host,
                port=self.settings.http_port,
                name="outbox-relay-http",
            )
        try:
            while not self._closed.is_set():
                try:
                    self._session()
                except (_Restart, KafkaException, OutboxError) as err:
                    self._ready = (False, f"restarting after: {err}")
                    log.error("relay session ended (%s); starting a new one", err)
                    self._closed.wait(self.settings.retry_backoff_s)
        finally:
            if self._http is not None:
                self._http.close()
                self._http = None

    def close(self) -> None:
        """Ask ``run()`` to finish the open batch (within the grace period) and return."""
        self._closed.set()

    @property
    def closed(self) -> threading.Event:
        """Set once ``close()`` was called."""
        return self._closed

    def idle_s(self) -> float:
        """Seconds since the loop last turned (or a session start or rebuild step moved on)."""
        return time.monotonic() - self._loop_at

    def live(self) -> tuple[bool, str]:
        idle = self.idle_s()
        if idle > self.settings.liveness_timeout_s:
            return False, f"the relay loop has not turned for {idle:.0f} s"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        return self._ready

    # -- one session: a transactional producer and a consumer ------------------------------

    def _base_config(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.settings.bootstrap_servers, **self.settings.kafka}

    def _producer_config(self) -> dict[str, Any]:
        """The transactional producer's settings.

        ``retry.backoff.ms`` 10 (librdkafka's default is 100): a transaction's commit returns
        before the coordinator has written its markers, so the next transaction's
        AddOffsetsToTxn often meets CONCURRENT_TRANSACTIONS and is retried after this back-off
        (librdkafka retries AddPartitionsToTxn after 20 ms whatever it is set to). With 100 ms,
        1 in 4-5 commits waited that long under the benchmark's 100 txn/s: end-to-end p99
        210-326 against 107-175 ms with 10 in paired runs (docs/benchmarks.md). Set ``kafka``
        to override it.
        """
        return {
            "retry.backoff.ms": 10,
            **self._base_config(),
            "transactional.id": self.settings.transactional_id,
            "transaction.timeout.ms": int(self.settings.transaction_timeout_s * 1000),
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "batch.num.messages": 10000,
            "allow.auto.create.topics": False,
            "partitioner": "murmur2_random",
        }

    def _session(self) -> None:
        self.sessions += 1
        self._callback_error = None
        self._loop_at = time.monotonic()
        config = self._base_config()
        self._producer = Producer(self._producer_config())
        self._history = OpHistory(config, self.names.op)
        self._fetcher = HalfFetcher(config, self.names.half)
        self._topics = TopicCache(
            {k: v for k, v in config.items() if not k.startswith(("linger", "batch", "queue"))},
            refresh_s=self.settings.topic_refresh_s,
            auto_create=self.settings.auto_create_topics,
            auto_create_partitions=self.settings.auto_create_partitions,
        )
        try:
            self._producer.init_transactions(self.settings.transaction_timeout_s * 3)
            self._loop_at = time.monotonic()
            self._consumer = Consumer(
                {
                    "session.timeout.ms": 10000,
                    "heartbeat.interval.ms": 1000,
                    # librdkafka prefetches up to 64 MiB by default; a batch needs far less
                    "queued.max.messages.kbytes": 16384,
                    **config,
                    "group.id": self.settings.group_id,
                    "partition.assignment.strategy": "range",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    # Offsets are always given on assignment (the committed progress, or 0).
                    # Out of range means the broker shows less than was read before (right
                    # after a restart) or retention removed records: jumping to either end
                    # would repeat or skip decisions, so the session starts over instead.
                    "auto.offset.reset": "error",
                }
            )
            self._consumer.subscribe(
                [self.names.half, self.names.op],
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_lost,
            )
            self._ready = (True, "subscribed")
            self._loop()
        finally:
            self._end_session()

    def _end_session(self) -> None:
        for state in [*self.states.values(), *(s for s, _ in self._retained.values())]:
            self._retire(state)
        self.states = {}
        self._retained = {}
        self._committed = {}
        self._paused = set()
        if self._consumer is not None:
            try:
                self._consumer.close()
            except KafkaException as err:
                log.warning("consumer close: %s", err)
        self._history.close()
        self._fetcher.close()
        self._consumer = self._producer = None  # librdkafka handles go with the objects

    def _loop(self) -> None:
        assert self._consumer is not None
        last = time.monotonic()
        read = 0
        while not self._closed.is_set():
            self._loop_at = time.monotonic()
            messages = self._consumer.consume(
                self.settings.batch_max_records, self.settings.poll_timeout_s
            )
            if self._callback_error is not None:
                err, self._callback_error = self._callback_error, None
                raise _Restart(f"cannot take the assigned partitions: {err}") from err
            for msg in messages:
                self._route(msg)
            read += len(messages)
            self._flow_control()
            now = time.monotonic()
            caught_up = read > 0 and len(messages) < self.settings.batch_max_records
            if (
                read >= self.settings.batch_max_records
                or now - last >= self.settings.commit_interval_s
                or (caught_up and self.settings.commit_when_caught_up)
            ):
                self._commit_batch()
                last, read = time.monotonic(), 0
            if now - self._lag_at >= LAG_EVERY_S:
                self._measure_lag()
                self._lag_at = now
        self._commit_batch(timeout=self.settings.shutdown_grace_s)

    # -- input -----------------------------------------------------------------------------

    def _route(self, msg: Message) -> None:
        error = msg.error()
        if error is not None:
            if error.code() == KafkaError._AUTO_OFFSET_RESET:
                self._out_of_range(str(msg.topic()), int(msg.partition() or 0), error)
                return
            if error.code() != KafkaError._PARTITION_EOF:
                log.warning("consumer error: %s", error.str())
            return
        partition = msg.partition()
        state = self.states.get(partition) if partition is not None else None
        if state is None:
            return  # not co-assigned (both topics must have equal partition counts)
        offset = int(msg.offset() or 0)
        try:
            if msg.topic() == self._half:
                state.add_half(
                    decode_half(
                        value=msg.value(),
                        headers=msg.headers(),
                        partition=state.partition,
                        offset=offset,
                        timestamp_ms=msg.timestamp()[1],
                    )
                )
            else:
                op = decode_op(msg.key(), msg.value(), partition=state.partition, offset=offset)
                if op is not None and op.half_partition != state.partition:
                    raise ProtocolError(
                        f"op record at partition {state.partition} offset {offset} names half "
                        f"partition {op.half_partition}; a transaction's op and halves share one"
                    )
                state.add_op(offset, op)
        except ProtocolError as err:
            bad = _bad(msg, state.partition, offset, str(err))
            state.add_bad(bad, half=msg.topic() == self._half)

    def _out_of_range(self, topic: str, partition: int, error: KafkaError) -> None:
        """Start over. Below the log start, retention removed half records before they were
        read: the new session starts at the log start (see :meth:`_rebuilt_all`); librdkafka
        cannot seek a partition its offset reset stopped. At or past the end, the broker
        shows less than was read before (right after a restart)."""
        assert self._consumer is not None
        state = self.states.get(partition)
        if state is None:
            return
        position = state.half_position if topic == self._half else state.op_read_position
        low, _ = self._consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=10, cached=False
        )
        removed = f"{topic}[{partition}]: offsets {position}..{low - 1} were removed"
        if position < low and topic == self._half:
            raise _Restart(f"{removed} by retention before the relay read them; going on at {low}")
        if position < low:
            raise _Restart(
                f"{removed}; decisions must not be skipped, so the relay cannot go on: the op "
                "topic must have cleanup.policy=compact alone (`outbox topics ensure` checks it)"
            )
        raise _Restart(f"{topic}[{partition}] position {position} out of range: {error.str()}")

    def _flow_control(self) -> None:
        """Pause reading an op partition whose queue is long; resume it once it drained."""
        assert self._consumer is not None
        limit = self.settings.max_queued_ops
        for p, state in self.states.items():
            tp = [TopicPartition(self.names.op, p)]
            if p not in self._paused and len(state.queue) > limit:
                self._consumer.pause(tp)
                self._paused.add(p)
            elif p in self._paused and len(state.queue) <= limit // 2:
                self._consumer.resume(tp)
                self._paused.discard(p)

    # -- one batch = one Kafka transaction -------------------------------------------------

    def _commit_batch(self, timeout: float | None = None) -> None:
        assert self._consumer is not None and self._producer is not None
        if not self.states:
            return
        self._retry = min(self._due, key=self._due.__getitem__) if self._due else None
        self._due = {}
        batches = {p: self._take(p, state) for p, state in self.states.items()}
        todo = {
            p: b
            for p, b in batches.items()
            if b.actions or (b.half_offset, b.op_offset, b.metadata) != self._committed.get(p)
        }
        if not todo:
            self._count_committed()
            return
        timeout = timeout or self.settings.transaction_timeout_s
        started = time.monotonic()
        self._failures = []
        try:
            self._producer.begin_transaction()
            for p, batch in todo.items():
                for action in batch.actions:
                    self._emit(p, action)
            offsets = [
                tp
                for p, b in todo.items()
                for tp in (
                    TopicPartition(self.names.half, p, b.half_offset),
                    TopicPartition(self.names.op, p, b.op_offset, metadata=b.metadata),
                )
            ]
            self._send_offsets(offsets, timeout)
            self._commit(timeout)
        except KafkaException as err:
            self._failed(err.args[0], timeout)
            return
        self.metrics.commit_seconds.observe(time.monotonic() - started)
        for p, b in todo.items():
            self._committed[p] = (b.half_offset, b.op_offset, b.metadata)
        self._count_committed()
        self._ready = (True, "committing")

    def _send_offsets(self, offsets: list[TopicPartition], timeout: float) -> None:
        assert self._producer is not None and self._consumer is not None
        producer, metadata = self._producer, self._consumer.consumer_group_metadata()
        _retried(
            "send_offsets_to_transaction",
            lambda: producer.send_offsets_to_transaction(offsets, metadata, timeout),
        )

    def _commit(self, timeout: float) -> None:
        assert self._producer is not None
        producer = self._producer
        _retried("commit_transaction", lambda: producer.commit_transaction(timeout))

    def _failed(self, error: KafkaError, timeout: float) -> None:
        """A batch failed: abort it, park what a real topic refused, and start again from the
        committed progress."""
        assert self._producer is not None
        self.aborts += 1
        self._ready = (False, f"last Kafka transaction failed: {error.str()}")
        try:
            if error.fatal():
                raise _Restart(f"Kafka transaction failed: {error.str()}")
            required = error.txn_requires_abort()
            if required:
                log.warning(
                    "Kafka transaction aborted (%s); redoing from the committed offsets", error
                )
            # Also where not required: a producer dropped with a transaction open leaves the
            # broker to time it out while a new session starts over.
            try:
                self._producer.abort_transaction(timeout)
            except KafkaException as err:
                if required:
                    raise _Restart(f"abort_transaction failed: {err}") from err
            # Redo it in a new session rather than with this producer: a new one bumps the
            # producer epoch (init_transactions), so nothing left of the aborted transaction on
            # the broker - after a broker restart its view and the client's can differ - can
            # ever be completed by a later commit of the same epoch.
            raise _Restart(
                f"Kafka transaction {'aborted' if required else 'failed'}: {error.str()}"
            )
        finally:
            self._park_refused()  # every way out, after the abort (if any) settled the batch

    def _park_refused(self) -> None:
        """Park each transaction a real topic refused a record of, so that the redone batch
        goes without it (until ``park_retry_s``) instead of failing the same way forever.

        A refusal fails the transaction call as soon as the broker answers; the reports a
        failed call left queued are served here first, once the abort has settled them all.
        """
        assert self._producer is not None
        try:
            self._producer.poll(0)
        except KafkaException as err:  # a report callback's own failure: keep what was noted
            log.warning("serving the failed batch's delivery reports: %s", err)
        now = time.monotonic()
        for txn_id, why in self._failures:
            if txn_id is not None:
                self._refused[txn_id] = now
                log.error(
                    "transaction %s: its real topic refused a write (%s); parked", txn_id, why
                )
            else:  # a dead letter or a put-back copy: nothing to park, the batch is redone
                log.error(
                    "a write to an internal topic was refused (%s); redoing the batch (a "
                    "refused dead letter goes without the original record, a refused put-back "
                    "not at all)",
                    why,
                )
        self._failures = []

    def _take(self, partition: int, state: PartitionState) -> Batch:
        while True:
            result = state.take(
                int(time.time() * 1000),
                put_back_after_ms=int(self.settings.put_back_after_s * 1000),
                log_end=self._log_end(partition),
                verified_end=self._verified_end(partition, state),
                promotable=self._promotable,
                unmovable=self._unmovable,
            )
            if isinstance(result, Batch):
                return result
            assert isinstance(result, Need)
            state.supply(
                result.txn_id, self._fetcher.fetch(partition, result.offsets, result.txn_id)
            )

    def _promotable(self, op: OpRecord, records: tuple[HalfRecord, ...]) -> str | None:
        why = self._why_not(op, records)
        if why is None:
            if self._parked_logged:
                self._parked_logged.discard(op.txn_id)
        elif op.txn_id not in self._parked_logged:
            if len(self._parked_logged) > 100_000:
                self._parked_logged.clear()
            self._parked_logged.add(op.txn_id)
            log.warning("transaction %s parked: %s", op.txn_id, why)
        return why

    def _why_not(self, op: OpRecord, records: tuple[HalfRecord, ...]) -> str | None:
        # one record is the common case, once per promotion: no set, no sort
        topics = (
            (records[0].message.topic,)
            if len(records) == 1
            else sorted({r.message.topic for r in records})
        )
        for topic in topics:
            if not self._topics.exists(topic):
                return f"topic {topic} does not exist (set auto_create_topics to create it)"
        if not self._refused:
            return None
        refused = self._refused.get(op.txn_id)
        if refused is not None:
            # One a batch, the longest refused first: the broker refuses a record batch whole,
            # so transactions refused together are retried apart - the others get through,
            # and the one at fault, refused again, goes to the back.
            if time.monotonic() - refused < self.settings.park_retry_s:
                return "its real topic refused a write; retried later"
            if op.txn_id != self._retry:
                self._due[op.txn_id] = refused
                return "its real topic refused a write; retried after those refused before it"
            del self._refused[op.txn_id]
            self._retry = None
        return None

    def _log_end(self, partition: int) -> int:
        """The half partition's end as known here: the consumer's last fetch, or past the last
        copy this relay put back, whichever is further."""
        assert self._consumer is not None
        try:
            _, high = self._consumer.get_watermark_offsets(
                TopicPartition(self.names.half, partition), cached=True
            )
        except KafkaException:
            high = 0
        return max(int(high), self._copies_end.get(partition, 0))

    def _verified_end(self, partition: int, state: PartitionState) -> int | None:
        """The half partition's end from the broker, when the op at the head has waited a
        while for records at or past the end as last seen (an op naming records that exist
        just waits for the reader, which is the common case while catching up)."""
        assert self._consumer is not None
        op = state.waiting_op()
        if op is None or max(op.half_offsets, default=-1) < self._log_end(partition):
            self._waiting_since.pop(partition, None)
            return None
        since = self._waiting_since.setdefault(partition, time.monotonic())
        if time.monotonic() - since < VERIFY_AFTER_S:
            return None
        self._waiting_since[partition] = time.monotonic()
        try:
            _, high = self._consumer.get_watermark_offsets(
                TopicPartition(self.names.half, partition), timeout=5, cached=False
            )
        except KafkaException:
            return None
        return int(high)

    # -- output ----------------------------------------------------------------------------

    def _emit(self, partition: int, action: Action) -> None:
        if isinstance(action, Promote):
            # A delivery report carries no headers (confluent-kafka), so the transaction a
            # refused record belongs to rides in its callback: one per transaction.
            on_delivery = functools.partial(self._delivered, action.op.txn_id)
            for record in action.records:
                self._produce(promoted(record), on_delivery, action.op.txn_id)
        elif isinstance(action, PutBack):
            txn_id = action.records[0].txn_id
            on_copied = functools.partial(self._copied, txn_id)
            for record in action.records:
                copy = Outgoing(
                    self.names.half,
                    record.txn_id.encode(),
                    record.message.value,
                    list(copy_headers(record)),
                    partition=partition,
                )
                self._produce(copy, on_copied, on_refused=functools.partial(self._stays, txn_id))
        elif isinstance(action, Reject):
            self._reject(action)
        elif isinstance(action, BadRecord):
            self._dead_letter(
                action.reason,
                action.topic,
                action.partition,
                action.offset,
                action.key,
                action.value,
                list(action.headers),
            )
        else:
            assert isinstance(action, Drop)

    def _reject(self, action: Reject) -> None:
        op = action.op
        reason = f"{op.state.value} op at offset {op.offset} for {op.txn_id}: {action.reason}"
        log.error("dead-lettering: %s", reason)
        key, value = encode_op(op)
        self._dead_letter(reason, self.names.op, op.partition, op.offset, key, value, None)

    def _dead_letter(
        self,
        reason: str,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, str | bytes | None]] | None,
    ) -> None:
        source = (topic, partition, offset)
        refused = self._letters_refused.pop(source, None)
        if refused is not None:
            omitted = (
                f"the dead-letter topic refused the original key, value and headers ({refused});"
                f" read them at {topic}[{partition}] offset {offset} while its retention lasts"
            )
            key, value, headers = None, None, [(DeadLetterHeader.OMITTED.value, omitted)]
        letter = dead_letter(
            self.names.dead_letter,
            reason=reason,
            source_topic=topic,
            source_partition=partition,
            source_offset=offset,
            key=key,
            value=value,
            headers=headers,
        )
        self._produce(
            letter,
            functools.partial(self._dead_letter_delivered, source),
            on_refused=functools.partial(self._letter_refused, source),
        )

    def _produce(
        self,
        out: Outgoing,
        on_delivery: Callable[[KafkaError | None, Message], None],
        txn_id: str | None = None,
        on_refused: Callable[[KafkaError], None] | None = None,
    ) -> None:
        """Queue one record of the open Kafka transaction (the hot path: no per-record
        closure, positional arguments).

        Raises:
            KafkaException: the client refused the record before sending it (bigger than its
                ``message.max.bytes``); noted against ``txn_id``, which the abort then parks,
                and handed to ``on_refused`` (the same handler its delivery report uses).
        """
        assert self._producer is not None
        partition = -1 if out.partition is None else out.partition  # -1: the partitioner
        while True:
            try:
                self._producer.produce(
                    out.topic, out.value, out.key, partition, on_delivery, headers=out.headers
                )
                return
            except BufferError:
                self._producer.poll(0.05)  # local queue full: let deliveries drain
            except KafkaException as err:
                if refuses_the_record(err.args[0]):
                    self._failures.append((txn_id, f"{out.topic}: {err.args[0].str()}"))
                    if on_refused is not None:
                        on_refused(err.args[0])
                raise

    def _delivered(self, txn_id: str | None, err: KafkaError | None, msg: Message) -> None:
        """A promoted record's report: a refusal is noted against its transaction, which
        ``_park_refused`` parks once the batch is aborted."""
        if err is not None and refuses_the_record(err):
            self._failures.append((txn_id, f"{msg.topic()}: {err.str()}"))

    def _dead_letter_delivered(
        self, source: tuple[str, int, int], err: KafkaError | None, msg: Message
    ) -> None:
        if err is not None and refuses_the_record(err):
            self._letter_refused(source, err)
        self._delivered(None, err, msg)

    def _letter_refused(self, source: tuple[str, int, int], err: KafkaError) -> None:
        """The dead letter of ``source`` is redone (its batch aborts) without the original."""
        self._letters_refused[source] = err.str()

    def _copied(self, txn_id: str, err: KafkaError | None, msg: Message) -> None:
        """A put-back copy's report: past its offset is where the half partition ends."""
        if err is not None:
            if refuses_the_record(err):
                self._stays(txn_id, err)
            self._delivered(None, err, msg)
            return
        p, end = int(msg.partition() or 0), int(msg.offset() or 0) + 1
        if end > self._copies_end.get(p, 0):
            self._copies_end[p] = end

    def _stays(self, txn_id: str, err: KafkaError) -> None:
        if txn_id not in self._unmovable:
            log.error(
                "transaction %s: the half topic refused its put-back copy (%s); it stays "
                "pending where it is, and the committed half offset waits for its decision",
                txn_id,
                err.str(),
            )
        if len(self._unmovable) > 100_000:
            self._unmovable.clear()
        self._unmovable.add(txn_id)

    # -- partitions ------------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # An exception must not escape a librdkafka callback: confluent-kafka re-raises it from
        # consume() as a bare KafkaError, which is no exception class and no handler catches
        # (a broker restart made the committed-offsets fetch fail with NOT_COORDINATOR and
        # killed the process). Keep it; the loop ends the session and starts a new one.
        try:
            self._assign(consumer, partitions)
        except (KafkaException, OutboxError) as err:
            self._callback_error = err

    def _assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        half = {tp.partition for tp in partitions if tp.topic == self.names.half}
        op = {tp.partition for tp in partitions if tp.topic == self.names.op}
        if half != op:
            log.error(
                "half partitions %s and op partitions %s differ: the topics need equal "
                "partition counts; only the common ones are handled",
                sorted(half),
                sorted(op),
            )
        self.assigned = (frozenset(half), frozenset(op))
        numbers = sorted(half & op)
        retained, self._retained = self._retained, {}
        try:
            progress = self._progress(consumer, numbers)
            kept = self._kept(retained, progress)
        finally:
            for p, (state, _) in retained.items():
                if p not in self.states:
                    self._retire(state)
        self.states.update(self._rebuilt_all({p: progress[p] for p in numbers if p not in kept}))
        for tp in partitions:
            # kept: where this instance stopped; rebuilt: the committed progress
            held = self.states.get(tp.partition)
            if held is not None:
                half_topic = tp.topic == self.names.half
                tp.offset = held.half_position if half_topic else held.op_read_position
        consumer.assign(partitions)
        log.info("assigned partitions %s (instance %s)", numbers, self.settings.instance_id)

    def _kept(
        self,
        retained: dict[int, tuple[PartitionState, tuple[int, int, str] | None]],
        progress: dict[int, Progress],
    ) -> dict[int, PartitionState]:
        """Partitions given back right after this instance let them go, whose committed
        progress is still the one this instance committed: their states are kept as they were.

        A rebuild would re-read the op topic from the dedup window's start (up to
        ``dedup_window_s`` of ops) for each; a group that grows or shrinks would stall for
        that long. Nothing can have been decided for such a partition meanwhile: every
        promotion, drop or put-back is committed with its progress in one Kafka transaction
        and none was open across the revoke (they begin and end inside one loop turn), and
        in an eager rebalance no other member held the partition between the revoke and this
        assignment. Any difference in the committed progress (another member's commit, or a
        stale read of it) sends the partition through the rebuild instead.
        """
        kept = {}
        for p, (state, ours) in retained.items():
            if p in progress and ours is not None and self._committed.get(p) == ours:
                kept[p] = state
                self.states[p] = state
                log.info(
                    "partition %d kept across the rebalance: nothing committed since this "
                    "instance let it go (half from %d, op from %d)",
                    p,
                    state.half_position,
                    state.op_read_position,
                )
        return kept

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._let_go(partitions, retain=True)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Lost, not revoked: the group may have given them to another member already.
        self._let_go(partitions, retain=False)

    def _let_go(self, partitions: list[TopicPartition], *, retain: bool) -> None:
        numbers = sorted({tp.partition for tp in partitions if tp.partition in self.states})
        self.assigned = (frozenset(), frozenset())
        for state, _ in self._retained.values():
            self._retire(state)
        self._retained = {}
        for p in numbers:
            state = self.states.pop(p)
            committed = self._committed.pop(p, None)
            if retain:
                self._retained[p] = (state, committed)
            else:
                self._retire(state)
            self._waiting_since.pop(p, None)
            self._paused.discard(p)
        log.info(
            "%s partitions %s (instance %s)",
            "revoked" if retain else "lost",
            numbers,
            self.settings.instance_id,
        )

    def _progress(self, consumer: Consumer, numbers: Iterable[int]) -> dict[int, Progress]:
        wanted = [
            TopicPartition(topic, p) for p in numbers for topic in (self.names.half, self.names.op)
        ]
        committed = {(tp.topic, tp.partition): tp for tp in consumer.committed(wanted, 30)}
        for tp in committed.values():
            if tp.error is not None:
                # A partition answered with an error carries no offset (OFFSET_INVALID): read
                # as "nothing committed", the relay would start from 0 and promote all again.
                raise KafkaException(tp.error)
        progress = {}
        for p in numbers:
            half = committed[(self.names.half, p)]
            op = committed[(self.names.op, p)]
            at = Progress.parse(max(half.offset, 0), max(op.offset, 0), op.metadata)
            progress[p] = at
            self._committed[p] = (at.half_offset, at.op_offset, op.metadata or "")
        return progress

    def _rebuilt_all(self, progress: dict[int, Progress]) -> dict[int, PartitionState]:
        assert self._consumer is not None
        window_ms = int((time.time() - self.settings.dedup_window_s) * 1000)
        starts = self._history.starts_for_time(progress, window_ms)
        states = {}
        for p, at in progress.items():
            self._loop_at = time.monotonic()  # a long rebuild is progress, not a hang
            low, end = self._consumer.get_watermark_offsets(
                TopicPartition(self.names.half, p), timeout=10, cached=False
            )
            if at.half_offset < low:
                log.error(
                    "%s[%d]: offsets %d..%d were removed by retention before the relay read "
                    "them (lengthen the retention of the internal topics); going on from %d, "
                    "and a COMMIT naming them is dead-lettered",
                    self.names.half,
                    p,
                    at.half_offset,
                    low - 1,
                    low,
                )
                at = dataclasses.replace(at, half_offset=int(low))
            states[p] = rebuild(
                self._history,
                p,
                at,
                log_end=int(end),
                window_start=starts[p],
                max_held_records=self.settings.max_held_records,
                decided_memory=self.settings.decided_memory,
            )
        return states

    # -- views -----------------------------------------------------------------------------

    def _count_committed(self) -> None:
        """Counters count what a committed Kafka transaction wrote: an aborted batch is
        redone from the committed progress and would otherwise count its promotions and drops
        again (and a partition let go of is counted by whoever redoes it)."""
        for state in self.states.values():
            counters = state.counters
            for key, value in vars(counters).items():
                if value:
                    self._counted[key] += value
            state.counters = type(counters)()

    def _retire(self, state: PartitionState) -> None:
        """A partition let go of: what it counted since its last commit was not written (or,
        read but not decided, will be decided and counted by its next owner)."""
        state.counters = type(state.counters)()

    @property
    def dead_lettered(self) -> int:
        """Dead letters in committed Kafka transactions: one for each rejected op and each
        undecodable record."""
        return self._counted["rejected"] + self._counted["bad_records"]

    def totals(self) -> dict[str, int]:
        """Counters over this instance's life, as of its last committed Kafka transaction."""
        return dict(self._counted)

    def lag(self) -> dict[tuple[str, int], int]:
        """Lag as of the loop's last look (the HTTP thread must not call into the consumer:
        librdkafka blocks it while the loop consumes)."""
        return dict(self._lag)

    def _measure_lag(self) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        lag = {}
        for p, (half, op, _) in list(self._committed.items()):
            for topic, committed in ((self.names.half, half), (self.names.op, op)):
                try:
                    _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)
                except KafkaException:
                    continue
                lag[(topic, p)] = max(int(high) - committed, 0)
        self._lag = lag

    def stats(self) -> dict[str, int]:
        """Totals plus what is held now."""
        states = list(self.states.values())
        return {
            **self.totals(),
            "pending": sum(s.pending_records for s in states),
            "held": sum(s.held for s in states),
            "parked": sum(len(s.parked) for s in states),
            "dead_lettered": self.dead_lettered,
            "aborts": self.aborts,
            "sessions": self.sessions,
        }

    def assignment(self) -> list[int]:
        return sorted(self.states)


def _bad(msg: Message, partition: int, offset: int, reason: str) -> BadRecord:
    pairs: list[tuple[str, Any]] = list(msg.headers() or [])  # type: ignore[arg-type]
    headers = tuple((n, v if isinstance(v, bytes) else (v or "").encode()) for n, v in pairs)
    return BadRecord(msg.topic() or "", partition, offset, msg.key(), msg.value(), headers, reason)

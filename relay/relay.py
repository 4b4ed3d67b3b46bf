"""The relay: promotes committed half messages to their real topics, drops rolled-back ones.

At least once, never lost: progress (the consumer offsets of the half and op partitions) is
committed only after every promotion before it was acknowledged, and never past a half record
whose transaction is undecided. A failed delivery makes the relay re-read from its committed
offsets. Instances in one consumer group share the partitions; the range assignor gives one
instance the same partition number of both topics (they have equal partition counts).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from outbox.errors import ProtocolError
from outbox.protocol.half import decode_half
from outbox.protocol.op import decode_op, encode_op
from relay.promotion import Outgoing, dead_letter, promoted
from relay.rebuild import rebuild
from relay.settings import RelaySettings
from relay.state import Missing, PartitionState, Promote

log = logging.getLogger("relay")


class _Rewind(Exception):
    """A delivery failed: drop in-memory state and re-read from the committed offsets."""


class Relay:
    """One relay instance. ``run()`` blocks until ``close()`` is called."""

    def __init__(self, settings: RelaySettings) -> None:
        self.settings = settings
        self.names = settings.topics
        self.states: dict[int, PartitionState] = {}
        self.dead_lettered = 0
        self.rewinds = 0
        self._closed = threading.Event()
        self._failures: list[str] = []
        self._committed: dict[int, tuple[int, int]] = {}
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None

    # -- life cycle ------------------------------------------------------------------------

    def run(self) -> None:
        while not self._closed.is_set():
            self._open()
            try:
                self._loop()
            except _Rewind as err:
                self.rewinds += 1
                log.warning("delivery failed (%s); re-reading from the committed offsets", err)
                self._shutdown(commit=False)
                self._closed.wait(self.settings.retry_backoff_s)
                continue
            self._shutdown(commit=True)

    def close(self) -> None:
        """Ask ``run()`` to commit what was delivered and return."""
        self._closed.set()

    def _base_config(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.settings.bootstrap_servers, **self.settings.kafka}

    def _consumer_config(self) -> dict[str, Any]:
        return {
            **self._base_config(),
            "group.id": self.settings.group_id,
            "partition.assignment.strategy": "range",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }

    def _open(self) -> None:
        self._failures = []
        self.states = {}
        self._committed = {}
        self._producer = Producer(
            {
                **self._base_config(),
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "partitioner": "murmur2_random",
            }
        )
        self._consumer = Consumer(self._consumer_config())
        self._consumer.subscribe(
            [self.names.half, self.names.op],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def _shutdown(self, *, commit: bool) -> None:
        assert self._consumer is not None and self._producer is not None
        if commit:
            try:
                self._commit()
            except _Rewind as err:
                log.warning("final commit skipped: %s", err)
        self._consumer.close()
        self._producer.flush(self.settings.shutdown_grace_s)
        self.states = {}
        self._consumer = self._producer = None  # librdkafka handles go away with the objects

    # -- the loop --------------------------------------------------------------------------

    def _loop(self) -> None:
        assert self._consumer is not None
        last_commit = time.monotonic()
        produced = 0
        while not self._closed.is_set():
            batch = self._consumer.consume(
                self.settings.batch_max_records, self.settings.poll_timeout_s
            )
            for msg in batch:
                self._route(msg)
            produced += self._act()
            due = time.monotonic() - last_commit >= self.settings.commit_interval_s
            if produced >= self.settings.batch_max_records or due:
                self._commit()
                last_commit, produced = time.monotonic(), 0

    def _route(self, msg: Message) -> None:
        error = msg.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                log.warning("consumer error: %s", error.str())
            return
        partition = msg.partition()
        state = self.states.get(partition) if partition is not None else None
        if state is None:
            return  # not co-assigned (both topics must have equal partition counts)
        if msg.topic() == self.names.half:
            self._route_half(msg, state)
        else:
            self._route_op(msg, state)

    def _route_half(self, msg: Message, state: PartitionState) -> None:
        offset = msg.offset() or 0
        try:
            record = decode_half(
                value=msg.value(),
                headers=msg.headers(),
                partition=state.partition,
                offset=offset,
                timestamp_ms=msg.timestamp()[1],
            )
        except ProtocolError as err:
            self._dead_letter(msg, err)
            state.skip_half(offset)
            return
        state.add_half(record)

    def _route_op(self, msg: Message, state: PartitionState) -> None:
        offset = msg.offset() or 0
        try:
            op = decode_op(msg.key(), msg.value(), partition=state.partition, offset=offset)
        except ProtocolError as err:
            self._dead_letter(msg, err)
            op = None
        state.add_op(offset, op)

    def _act(self) -> int:
        produced = 0
        for state in self.states.values():
            for action in state.ready():
                if isinstance(action, Promote):
                    for record in action.records:
                        self._produce(promoted(record))
                    produced += len(action.records)
                elif isinstance(action, Missing):
                    self._missing(action)
        return produced

    def _missing(self, action: Missing) -> None:
        op = action.op
        reason = (
            f"COMMIT op at offset {op.offset} names half offsets {list(action.missing_offsets)} "
            f"of partition {op.half_partition} that were not found (retention?)"
        )
        log.error("transaction %s cannot be promoted: %s", op.txn_id, reason)
        key, value = encode_op(op)
        self._send_dead_letter(reason, self.names.op, op.partition, op.offset, key, value, None)

    # -- output ----------------------------------------------------------------------------

    def _produce(self, out: Outgoing) -> None:
        assert self._producer is not None
        kwargs: dict[str, Any] = {"key": out.key, "value": out.value, "headers": out.headers}
        if out.partition is not None:
            kwargs["partition"] = out.partition
        while True:
            try:
                self._producer.produce(out.topic, on_delivery=self._delivered, **kwargs)
                break
            except BufferError:
                self._producer.poll(0.1)  # local queue full: let deliveries drain
            except Exception as err:
                self._failures.append(f"{out.topic}: {err}")
                break
        self._producer.poll(0)

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self._failures.append(f"{msg.topic()}: {err.str()}")

    def _dead_letter(self, msg: Message, err: Exception) -> None:
        log.error("dead-lettering %s[%s]@%s: %s", msg.topic(), msg.partition(), msg.offset(), err)
        self._send_dead_letter(
            str(err),
            msg.topic() or "",
            msg.partition() or 0,
            msg.offset() or 0,
            msg.key(),
            msg.value(),
            msg.headers(),
        )

    def _send_dead_letter(
        self,
        reason: str,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: Any,
    ) -> None:
        self.dead_lettered += 1
        self._produce(
            dead_letter(
                self.names.dead_letter,
                reason=reason,
                source_topic=topic,
                source_partition=partition,
                source_offset=offset,
                key=key,
                value=value,
                headers=headers,
            )
        )

    # -- progress --------------------------------------------------------------------------

    def _commit(self, partitions: list[int] | None = None) -> None:
        """Commit safe offsets once everything produced so far is acknowledged."""
        assert self._consumer is not None and self._producer is not None
        left = self._producer.flush(self.settings.shutdown_grace_s)
        if self._failures or left:
            raise _Rewind(self._failures[0] if self._failures else f"{left} records unacknowledged")
        offsets = []
        for p in partitions if partitions is not None else list(self.states):
            safe = self.states[p].safe_offsets()
            if self._committed.get(p) != safe:
                offsets += [
                    TopicPartition(self.names.half, p, safe[0]),
                    TopicPartition(self.names.op, p, safe[1]),
                ]
                self._committed[p] = safe
        if offsets:
            self._consumer.commit(offsets=offsets, asynchronous=False)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        numbers = sorted({tp.partition for tp in partitions if tp.topic == self.names.op})
        wanted = [
            TopicPartition(topic, p) for p in numbers for topic in (self.names.half, self.names.op)
        ]
        committed = {(tp.topic, tp.partition): tp.offset for tp in consumer.committed(wanted, 30)}
        for p in numbers:
            half = committed.get((self.names.half, p), -1)
            op = committed.get((self.names.op, p), -1)
            self.states[p] = rebuild(self._base_config(), self.names.op, p, half, op)
            self._committed[p] = (self.states[p].half_position, self.states[p].op_done)
        log.info("assigned partitions %s", numbers)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        numbers = sorted({tp.partition for tp in partitions if tp.partition in self.states})
        try:
            self._commit(numbers)
        except _Rewind as err:
            log.warning("revoked partitions %s without commit: %s", numbers, err)
            self._failures.append(str(err))
        for p in numbers:
            self.states.pop(p, None)
            self._committed.pop(p, None)
        log.info("revoked partitions %s", numbers)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self.states.pop(tp.partition, None)
            self._committed.pop(tp.partition, None)

    def stats(self) -> dict[str, int]:
        """Counters over the partitions this instance holds now, plus its own totals."""
        totals = {"promoted": 0, "dropped": 0, "missing": 0, "duplicates": 0, "conflicts": 0}
        for state in self.states.values():
            for name in totals:
                totals[name] += getattr(state.counters, name)
        pending = sum(s.pending for s in self.states.values())
        return {
            **totals,
            "pending": pending,
            "dead_lettered": self.dead_lettered,
            "rewinds": self.rewinds,
        }

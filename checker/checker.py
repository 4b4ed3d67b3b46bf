"""The checker: finds transactions whose outcome never arrived and asks their producers.

It reads the half and op topics of the partitions it owns (a consumer group, range assignor, so
one instance owns partition p of both topics). The op partitions are read from their start up to
their high-watermark before anything is checked, so nothing already decided is checked. Answers
become op records (decided by: checker). After ``check_max`` UNKNOWN answers, or when no producer
of the group has been live for ``no_producer_timeout_s``, the transaction is given up: a GIVEN_UP
op, and its messages with the reason on the dead-letter topic.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from checker.breaker import Breaker
from checker.client import CheckClient, NoAnswer
from checker.instances import LiveInstances
from checker.settings import CheckerSettings
from checker.tracker import Pending, Tracker
from outbox.errors import ProtocolError
from outbox.fetch import HalfFetcher
from outbox.protocol.check import CheckedTransaction, split_requests
from outbox.protocol.dead_letter import dead_letter_headers
from outbox.protocol.half import HalfRecord, decode_half, why_incomplete
from outbox.protocol.op import OpRecord, decode_op, encode_op
from outbox.protocol.states import DecidedBy, LocalTransactionState, OpState

log = logging.getLogger("checker")
Answers = dict[str, LocalTransactionState]


@dataclass
class CheckerStats:
    checks: int = 0
    resolved_commit: int = 0
    resolved_rollback: int = 0
    unknown: int = 0
    given_up: int = 0
    incomplete: int = 0
    unreachable: int = 0
    breaker_trips: int = 0
    write_failures: int = 0


class Checker:
    """One checker instance: ``run()`` blocks until ``close()``."""

    def __init__(self, settings: CheckerSettings) -> None:
        self.settings = settings
        self.names = settings.topics
        self.stats = CheckerStats()
        self.tracker = Tracker(
            timeout_ms=int(settings.transaction_timeout_s * 1000),
            interval_ms=int(settings.check_interval_s * 1000),
        )
        secret = settings.secret.encode() if settings.secret else None
        self.client = CheckClient(
            secret, settings.request_timeout_s, max_request_bytes=settings.request_max_bytes
        )
        self._closed = threading.Event()
        self._loop_at = time.monotonic()
        self._ready = (False, "starting")
        self._ops_caught_up: set[int] = set()
        self._written: dict[str, OpState] = {}  # our own ops, not yet read back
        #: Given up for missing half records, GIVEN_UP op not yet taken (counted once taken).
        self._incomplete: set[str] = set()
        self._pool = ThreadPoolExecutor(settings.check_concurrency, "outbox-check")
        self.breakers: dict[str, Breaker] = defaultdict(
            lambda: Breaker(
                min_samples=settings.breaker_min_samples,
                threshold=settings.breaker_threshold,
                cooldown_s=settings.breaker_cooldown_s,
            )
        )

    def close(self) -> None:
        self._closed.set()

    def _config(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.settings.bootstrap_servers, **self.settings.kafka}

    def run(self) -> None:
        self._consumer = Consumer(
            {
                **self._config(),
                "group.id": self.settings.group_id,
                "partition.assignment.strategy": "range",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
            }
        )
        self._producer = Producer({**self._config(), "enable.idempotence": True, "acks": "all"})
        self.instances = LiveInstances(
            self._config(), self.names.registry, self.settings.registry_ttl_s
        )
        self._fetcher = HalfFetcher(self._config(), self.names.half)
        self._admin = AdminClient(self._config())
        self._consumer.subscribe(
            [self.names.half, self.names.op], on_assign=self._on_assign, on_revoke=self._on_revoke
        )
        self._ready = (True, "subscribed")
        try:
            while not self._closed.is_set():
                self._loop_at = time.monotonic()
                for msg in self._consumer.consume(1000, 0.2):
                    self._route(msg)
                self.instances.poll()
                self._check_due()
        finally:
            self._ready = (False, "stopped")
            self._pool.shutdown()
            self._consumer.close()
            self._producer.flush(10)
            self.instances.close()
            self._fetcher.close()

    def live(self) -> tuple[bool, str]:
        """Liveness: the loop turns (a check round is bounded by the request timeouts)."""
        idle = time.monotonic() - self._loop_at
        limit = self.settings.request_timeout_s * self.settings.failover_attempts + 60
        if idle > limit:
            return False, f"the checker loop has not turned for {idle:.0f} s"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        return self._ready

    # -- reading ---------------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            if tp.topic == self.names.op:
                tp.offset = OFFSET_BEGINNING  # learn every decision before checking anything
                self._ops_caught_up.discard(tp.partition)
        consumer.assign(partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            if tp.topic == self.names.half:
                self.tracker.drop_partition(tp.partition)
                self._ops_caught_up.discard(tp.partition)

    def _route(self, msg: Message) -> None:
        if msg.error():
            return
        if msg.topic() == self.names.op:
            try:
                op = decode_op(msg.key(), msg.value())
            except ProtocolError:
                return  # the relay dead-letters it; here it decides nothing
            if op is None:
                return
            if op.state is OpState.RESUMED:
                self.tracker.resume(
                    op.txn_id,
                    op.producer_group,
                    op.half_partition,
                    op.half_offsets,
                    msg.timestamp()[1],
                )
            elif self._written.pop(op.txn_id, None) is not op.state:
                self.tracker.decide(op.txn_id, op.state)
            return
        try:
            record = decode_half(
                value=msg.value(),
                headers=msg.headers(),
                partition=msg.partition() or 0,
                offset=msg.offset() or 0,
                timestamp_ms=msg.timestamp()[1],
            )
        except ProtocolError:
            return
        self.tracker.add_half(record)

    def _caught_up(self, partitions: set[int]) -> set[int]:
        """Which of ``partitions`` this instance has read on the op topic to their high-watermark
        (one offsets request for all of them; a partition once caught up stays so)."""
        behind = partitions - self._ops_caught_up
        if behind:
            ends = self._end_offsets(self.names.op, behind, timeout=5)
            positions = self._consumer.position(
                [TopicPartition(self.names.op, p) for p in sorted(ends)]
            )
            for tp in positions:
                if ends[tp.partition] == 0 or tp.offset >= ends[tp.partition]:
                    self._ops_caught_up.add(tp.partition)
        return partitions & self._ops_caught_up

    def _end_offsets(self, topic: str, partitions: set[int], timeout: float) -> dict[int, int]:
        """High-watermarks of ``partitions`` in one request per leader; a partition whose
        offset could not be had is left out (treated as not read to its end)."""
        request = {
            TopicPartition(topic, p): OffsetSpec.latest()  # type: ignore[no-untyped-call]
            for p in sorted(partitions)
        }
        futures = self._admin.list_offsets(
            request,
            isolation_level=IsolationLevel.READ_UNCOMMITTED,
            request_timeout=timeout,
        )
        ends: dict[int, int] = {}
        for tp, future in futures.items():
            try:
                ends[tp.partition] = int(future.result().offset)
            except KafkaException as err:
                log.warning("end offset of %s [%d] not known: %s", topic, tp.partition, err)
        return ends

    # -- checking --------------------------------------------------------------------------

    def _check_due(self) -> None:
        now_ms = int(time.time() * 1000)
        due = self.tracker.due(now_ms)
        if not due:
            return
        ready = self._caught_up({p.partition for p in due})
        by_group: dict[str, list[Pending]] = defaultdict(list)
        for entry in due:
            if entry.partition in ready:
                by_group[entry.group].append(entry)
        batches = [
            (group, batch)
            for group, entries in by_group.items()
            if self.breakers[group].allows(now_ms / 1000)  # paused groups stay due, unpenalised
            for batch in self._requests(entries)
        ]
        # Back-pressure: at most this many requests per round; the rest stay due for the next.
        batches = batches[: self.settings.check_concurrency * 2]
        futures = {
            self._pool.submit(self._ask, group, [checked for _, checked in batch]): (
                group,
                [entry for entry, _ in batch],
            )
            for group, batch in batches
        }
        answered = [(*futures[f], f.result()) for f in as_completed(futures)]
        # One read to the end of every half partition a COMMIT answer names, for the round.
        commit_partitions = {
            entry.partition
            for _, entries, result in answered
            if not isinstance(result, NoAnswer)
            for entry in entries
            if result[entry.txn_id] is LocalTransactionState.COMMIT
        }
        halves_read = not commit_partitions or self._read_halves_to_end(commit_partitions)
        for group, entries, result in answered:
            self._apply(group, entries, result, now_ms, halves_read=halves_read)
        self._producer.flush(10)

    def _requests(self, entries: list[Pending]) -> list[list[tuple[Pending, CheckedTransaction]]]:
        """The check requests for one group's due transactions, each carrying the first half
        record in hand of every transaction it asks about (its ``check_by`` routes the check at
        the endpoint; its message is what ``check_local_transaction`` receives). A transaction
        with no half record left to read (a resumed one whose copies are gone) is not asked
        about: it is given up, as nothing of it could be delivered."""
        checked: dict[str, tuple[Pending, CheckedTransaction]] = {}
        for entry in entries:
            entry = self._with_records(entry)
            if not entry.records:
                self._give_up(entry, "none of its half records is left to read")
                continue
            first = entry.records[min(entry.records)]
            checked[entry.txn_id] = (
                entry,
                CheckedTransaction(entry.txn_id, first.check_by, entry.checks, first),
            )
        splits = split_requests(
            (c for _, c in checked.values()),
            max_ids=self.settings.batch_size,
            max_bytes=self.settings.request_max_bytes,
        )
        return [[checked[c.txn_id] for c in split] for split in splits]

    def _ask(self, group: str, transactions: list[CheckedTransaction]) -> Answers | NoAnswer:
        """Runs in a worker thread: HTTP only, no Kafka client is touched here."""
        instances = self.instances.pick(group, self.settings.failover_attempts)
        if not instances:
            return NoAnswer(f"no live instance of producer group {group!r}", asked=False)
        try:
            return self.client.check(instances, transactions)
        except NoAnswer as err:
            return err

    def _apply(
        self,
        group: str,
        entries: list[Pending],
        result: Answers | NoAnswer,
        now_ms: int,
        *,
        halves_read: bool,
    ) -> None:
        if isinstance(result, NoAnswer):
            if result.asked:
                self._trip(group, [True] * len(entries), now_ms)
            self._unreachable(entries, now_ms, str(result))
            return
        answers = result
        self.stats.checks += len(entries)
        unknown = [answers[e.txn_id] is LocalTransactionState.UNKNOWN for e in entries]
        self._trip(group, unknown, now_ms)
        commits = any(answers[e.txn_id] is LocalTransactionState.COMMIT for e in entries)
        if commits and not halves_read:
            log.warning("half partitions not read to their end in time; answers applied later")
            return  # still due: checked again next round, no attempt counted
        for entry in entries:
            if entry.txn_id in self.tracker.pending:  # not decided meanwhile by another op
                self._answered(entry, answers[entry.txn_id], now_ms)

    def _trip(self, group: str, bad: list[bool], now_ms: int) -> None:
        breaker = self.breakers[group]
        if any([breaker.record(b, now_ms / 1000) for b in bad]):
            self.stats.breaker_trips += 1
            log.error(
                "circuit breaker open for producer group %r for %.0f s: most recent checks "
                "answered UNKNOWN or failed",
                group,
                breaker.cooldown_s,
            )

    def _read_halves_to_end(self, partitions: set[int]) -> bool:
        """Before a COMMIT is written, read every half record the transaction can have.

        Its producer had every half acknowledged before its DB commit, and the commit came
        before the answer, so all of them lie below the half partition's high-watermark now
        (asked once per round, for every partition at once: a request per partition per batch
        was most of the checker's time).
        """
        ends = self._end_offsets(self.names.half, partitions, timeout=10)
        if len(ends) < len(partitions):
            return False
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            positions = self._consumer.position([TopicPartition(self.names.half, p) for p in ends])
            if all(tp.offset >= ends[tp.partition] for tp in positions):
                return True
            for msg in self._consumer.consume(1000, 0.2):
                self._route(msg)
        return False

    def _answered(self, entry: Pending, state: LocalTransactionState, now_ms: int) -> None:
        if state is LocalTransactionState.COMMIT:
            self._commit(entry)
        elif state is LocalTransactionState.ROLLBACK:
            self._decide(entry, OpState.ROLLBACK, None)
        else:
            self.stats.unknown += 1
            self.tracker.unknown(entry, now_ms)
            if entry.checks >= self.settings.check_max:
                self._give_up(entry, f"still UNKNOWN after {entry.checks} checks")

    def _commit(self, entry: Pending) -> None:
        """A COMMIT names the whole transaction or is not written. The half partition was read
        to its end first, so a message still missing was removed by retention, was never
        written, or did not decode (the relay dead-letters those): the transaction is given up
        instead, what is in hand dead-lettered, and none of it delivered."""
        entry = self._with_records(entry)
        why = why_incomplete(entry.records.values())
        if why is None:
            self._decide(entry, OpState.COMMIT, None)
            return
        self._incomplete.add(entry.txn_id)
        self._give_up(
            entry,
            f"its producer answered COMMIT, but {why}; delivering the rest would deliver part "
            "of the transaction: re-send its messages from their source",
        )

    def _unreachable(self, entries: list[Pending], now_ms: int, why: str) -> None:
        self.stats.unreachable += len(entries)
        limit_ms = int(self.settings.no_producer_timeout_s * 1000)
        for entry in entries:
            if self.tracker.unreachable(entry, now_ms) >= limit_ms:
                self._give_up(entry, f"no producer of group {entry.group!r} answered: {why}")

    def _with_records(self, entry: Pending) -> Pending:
        """A resumed transaction whose copies were read before its RESUMED op: fetch them (some
        may have been read before it and some after, the two topics being read together)."""
        if len(entry.records) < len(entry.resumed_offsets):
            found = self._fetcher.fetch(entry.partition, entry.resumed_offsets, entry.txn_id)
            entry.resumed_offsets = ()  # fetched: a copy gone now stays gone (no second read)
            for record in found or ():
                entry.records.setdefault(record.index, record)
        return entry

    def _give_up(self, entry: Pending, reason: str) -> None:
        """Dead-letter copies of its records, then the GIVEN_UP op. A give-up whose op the broker
        did not take is repeated once its condition holds again: copies already taken are not
        written again. (Should that check answer COMMIT or ROLLBACK
        instead, the copies stay on the dead-letter topic while the decision is the answer's.)"""
        log.error("giving up transaction %s of group %s: %s", entry.txn_id, entry.group, reason)
        entry = self._with_records(entry)
        for index in sorted(entry.records):
            if index in entry.dead_lettered:
                continue
            record = entry.records[index]
            headers = dead_letter_headers(
                record.raw_headers,
                reason=reason,
                source_topic=self.names.half,
                source_partition=entry.partition,
                source_offset=record.original_offset,
            )
            self._producer.produce(
                self.names.dead_letter,
                key=entry.txn_id.encode(),
                value=record.message.value,
                headers=headers,
                partition=entry.partition,
                on_delivery=functools.partial(self._dead_letter_delivered, entry, record),
            )
        self._decide(entry, OpState.GIVEN_UP, reason)

    def _decide(self, entry: Pending, state: OpState, reason: str | None) -> None:
        entry = self._with_records(entry)
        op = OpRecord(
            txn_id=entry.txn_id,
            state=state,
            producer_group=entry.group,
            half_partition=entry.partition,
            half_offsets=tuple(entry.offsets),
            decided_by=DecidedBy.CHECKER,
            decided_at_ms=int(time.time() * 1000),
            reason=reason,
        )
        key, value = encode_op(op)
        self._producer.produce(
            self.names.op,
            key=key,
            value=value,
            partition=entry.partition,
            on_delivery=functools.partial(self._op_delivered, entry, state),
        )
        self._producer.poll(0)
        self._written[entry.txn_id] = state
        self.tracker.decide(entry.txn_id, state)

    def _op_delivered(
        self, entry: Pending, state: OpState, err: KafkaError | None, msg: Message
    ) -> None:
        """A decision the op topic did not take (the broker down past ``message.timeout.ms``,
        the record refused) is no decision: the transaction is checked again, as if never
        decided, after the check interval. Decisions are counted here, once the broker took
        them. Served on the loop's thread (poll and flush)."""
        if err is None:
            if state is OpState.COMMIT:
                self.stats.resolved_commit += 1
            elif state is OpState.ROLLBACK:
                self.stats.resolved_rollback += 1
            else:
                self.stats.given_up += 1
                if entry.txn_id in self._incomplete:
                    self._incomplete.discard(entry.txn_id)
                    self.stats.incomplete += 1
            return
        self.stats.write_failures += 1
        self._incomplete.discard(entry.txn_id)
        log.error(
            "the %s op of transaction %s was not written (%s); checking it again in %.0f s",
            state.value,
            entry.txn_id,
            err.str(),
            self.settings.check_interval_s,
        )
        if self._written.get(entry.txn_id) is state:
            del self._written[entry.txn_id]
        now_ms = int(time.time() * 1000)
        self.tracker.undecide(entry, due_ms=now_ms + int(self.settings.check_interval_s * 1000))

    def _dead_letter_delivered(
        self, entry: Pending, record: HalfRecord, err: KafkaError | None, msg: Message
    ) -> None:
        if err is None:
            entry.dead_lettered.add(record.index)
            return
        self.stats.write_failures += 1
        log.error(
            "the dead-letter copy of message %d of given-up transaction %s was not written "
            "(%s); the record is still at %s[%d] offset %d while its retention lasts",
            record.index,
            entry.txn_id,
            err.str(),
            self.names.half,
            record.partition,
            record.original_offset,
        )

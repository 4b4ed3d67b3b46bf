"""One checker session: its Kafka clients, its read positions, and the loop that reads, checks
and writes until it is closed or fails (:class:`checker.checker.Checker` then starts another).

Each round's writes and the read positions that make them true are one Kafka transaction
(:mod:`checker.writer`), so a zombie instance is fenced, and a restart starts from the committed
positions, reading what is pending rather than the topics' history (:mod:`checker.assignment`).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from checker.assignment import half_start, progress_metadata, restore_counts, starts
from checker.breaker import Breaker
from checker.client import CheckClient
from checker.end_offsets import end_offsets
from checker.instances import LiveInstances
from checker.plan import CheckerStats, RoundPlan
from checker.rounds import CheckRound
from checker.settings import ENV_PREFIX, CheckerSettings
from checker.tracing import written
from checker.tracker import Tracker
from checker.writer import Refusals, RoundFailed, RoundWriter
from outbox import kafka_clients
from outbox.broker_clock import BrokerClock
from outbox.closing import close_each
from outbox.consumer_errors import ConsumerErrors
from outbox.errors import OutboxError, ProtocolError
from outbox.fetch import HalfFetcher
from outbox.group_member import group_member_config
from outbox.protocol.half import decode_half
from outbox.protocol.op import decode_op
from outbox.protocol.states import OpState
from outbox.refused_settings import RefusedSettings
from outbox.service_health import Health
from outbox.watermarks import Watermarks

log = logging.getLogger("checker")

#: How often read positions are committed when no decision is written.
COMMIT_EVERY_S = 5.0


class Restart(Exception):
    """The session cannot go on: start a new one from the committed positions."""


class Session:
    """One session's clients and read positions; a failure ends it.

    Args:
        settings: the checker's settings.
        tracker: this session's undecided transactions (new for each session).
        client, refusals, breakers, stats, instances: the parts that outlive a session.
        health: what ``/healthz`` and ``/readyz`` answer; the loop keeps it current.
        closed: set when the checker is asked to stop; the loop then returns.
        clock: the broker's time, fed by this session's reads of every topic it reads.
    """

    def __init__(
        self,
        settings: CheckerSettings,
        tracker: Tracker,
        *,
        client: CheckClient,
        refusals: Refusals,
        breakers: dict[str, Breaker],
        stats: CheckerStats,
        instances: LiveInstances,
        health: Health,
        closed: threading.Event,
        clock: BrokerClock,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.names = settings.topics
        self.tracker = tracker
        self.stats = stats
        self.health = health
        self.closed = closed
        config = self.settings.client_config
        # The writer first: its init_transactions fences this instance's previous session, and
        # nothing else of the session is open yet should it fail (the registry's reader is the
        # checker's).
        self.writer = RoundWriter(
            config,
            self.names,
            settings.group_id,
            settings.transactional_id,
            refusals,
            progress=health.touch,
        )
        # the group's member (outbox.group_member): a read position below the log start is
        # never jumped over silently: the session starts over (_route), and the next one knows
        # where the gap was (_on_assign, Tracker.reading_from)
        consumer_config = group_member_config(settings.group_id, config)
        self.consumer = kafka_clients.consumer(consumer_config)
        self.refused = RefusedSettings(consumer_config, ENV_PREFIX)
        self.instances = instances
        self.fetcher = HalfFetcher(config, self.names.half)
        self.watermarks = Watermarks(config)
        #: None once the session has ended (:meth:`run` lets go of it).
        self.admin: AdminClient | None = kafka_clients.admin(config)
        self.pool = ThreadPoolExecutor(settings.check_concurrency, "outbox-check")
        self.round = CheckRound(
            settings,
            self.tracker,
            client=client,
            instances=self.instances,
            fetcher=self.fetcher,
            breakers=breakers,
            refusals=refusals,
            stats=stats,
            caught_up=self._caught_up,
            read_halves_to_end=self._read_halves_to_end,
            pool=self.pool,
        )
        self.assigned: set[int] = set()
        #: (topic, partition) read to its end since assigned (a partition EOF was seen).
        self.at_end: set[tuple[str, int]] = set()
        self.tombstones: list[tuple[int, str]] = []
        self.committed_at = 0.0
        self._assign_error: Exception | None = None
        #: The consumer's errors, said with what to grant; the last one is readiness's reason
        #: while no partition is assigned.
        self.consumer_errors = ConsumerErrors(
            "checker", settings.group_id, (self.names.half, self.names.op), log
        )

    def run(self) -> None:
        self.consumer.subscribe(
            [self.names.half, self.names.op], on_assign=self._on_assign, on_revoke=self._on_revoke
        )
        try:
            while not self.closed.is_set():
                self.health.touch()
                messages = self.consumer.consume(1000, 0.2)
                for msg in messages:
                    self._route(msg)
                self.consumer_errors.tick()  # a stopped consumer error's count, a minute on
                self.clock.read(messages)
                if self._assign_error is not None:
                    raise Restart(f"cannot take the assigned partitions: {self._assign_error}")
                self.instances.poll()  # first: readiness says what the registry says now
                self._update_ready()
                self._round()
        finally:
            self.health.set_ready(False, "stopped")
            self.consumer_errors.flush()  # the consumer errors counted, not yet logged
            self.pool.shutdown()
            # The session lives in reference cycles (its round and its consumer hold its bound
            # methods), which only the cyclic collector frees, some time later: until then the
            # admin client would stay connected and log a stopped broker's refused reconnects.
            self.admin = None
            close_each(
                (
                    self.writer.close,
                    self.consumer.close,
                    self.fetcher.close,
                    self.watermarks.close,
                ),
                log,
            )

    # -- assignment ------------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """An exception must not escape a librdkafka callback: kept, the loop starts over."""
        try:
            numbers = {tp.partition for tp in partitions if tp.topic == self.names.half}
            numbers &= {tp.partition for tp in partitions if tp.topic == self.names.op}
            if numbers:  # joined, with pairs to check: whatever kept it out has passed
                self.consumer_errors.clear()
            slack_ms = int(self.settings.clock_slack_s * 1000)
            # each step may wait on the broker: the health clock counts each one as a turn
            turned = self.health.touch
            found = starts(consumer, self.names, numbers, slack_ms=slack_ms, progress=turned)
            counts = restore_counts(
                self.settings.client_config,
                self.names,
                self.settings.group_id,
                numbers,
                watermarks=self.watermarks,
                progress=turned,
            )
            self.tracker.restored.update(counts)
            half_starts = {}
            for p in numbers:
                self.tracker.reading_from(p, found[p].half_offset)
                half_starts[p] = half_start(
                    self.watermarks, self.names.half, p, found[p].half_offset
                )
                turned()
            for tp in partitions:
                if tp.partition in found:
                    tp.offset = (
                        half_starts[tp.partition]
                        if tp.topic == self.names.half
                        else found[tp.partition].op_offset
                    )
            self.assigned |= numbers
            consumer.assign(partitions)
            log.info(
                "assigned partitions %s (%d check counts restored)", sorted(numbers), len(counts)
            )
        except (KafkaException, OutboxError) as err:
            self._assign_error = err

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.consumer_errors.clear()  # an error from before would be taken for the reason
        for tp in partitions:
            if tp.topic == self.names.half:
                self.tracker.drop_partition(tp.partition)
                self.assigned.discard(tp.partition)
            self.at_end.discard((tp.topic, tp.partition))
        self.health.set_ready(False, "rebalancing")

    # -- reading ---------------------------------------------------------------------------

    def _route(self, msg: Message) -> None:
        error = msg.error()
        topic, partition = str(msg.topic()), int(msg.partition() or 0)
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                self._reached_end(topic, partition)
            elif error.code() == KafkaError._AUTO_OFFSET_RESET and partition in self.assigned:
                # librdkafka cannot seek a partition its offset reset stopped: start over. (A
                # half partition held without its op partition is not read for anything.)
                raise Restart(
                    f"{topic}[{partition}]: read position out of range ({error.str()}): "
                    "retention removed records before this checker read them, or the log was "
                    "cut back; the next session starts from the committed positions"
                )
            else:
                refusal = self.refused.error_for(error)
                if refusal is not None:
                    raise refusal  # a setting the broker refuses: no new session would pass it
                # said, not dropped: a member refused its group or topics (an ACL missing)
                # holds no partition, and readiness alone said only "no partition assigned"
                self.consumer_errors.report(error, msg.topic())
            return
        if topic == self.names.op:
            self._op(msg, partition)
            return
        try:
            record = decode_half(
                value=msg.value(),
                headers=msg.headers(),
                partition=partition,
                offset=msg.offset() or 0,
                timestamp_ms=msg.timestamp()[1],
            )
        except ProtocolError:
            return
        self.tracker.add_half(record)

    def _op(self, msg: Message, partition: int) -> None:
        try:
            op = decode_op(msg.key(), msg.value())
        except ProtocolError:
            return  # the relay dead-letters it; here it decides nothing
        if op is None:
            return
        if op.state is OpState.RESUMED:
            self.tracker.resume(
                op.txn_id, op.producer_group, op.half_partition, op.half_offsets, msg.timestamp()[1]
            )
            return
        entry = self.tracker.decide(op.txn_id, op.state, partition, msg.timestamp()[1])
        if entry is not None and (entry.checks or entry.unreachable_since_ms is not None):
            self.tombstones.append((partition, op.txn_id))  # decided elsewhere: forget its count

    def _reached_end(self, topic: str, partition: int) -> None:
        if (topic, partition) in self.at_end:
            return
        self.at_end.add((topic, partition))
        if topic == self.names.half:
            self.tracker.read_to_end(partition)
        if (topic == self.names.half and (self.names.op, partition) in self.at_end) or (
            topic == self.names.op and (self.names.half, partition) in self.at_end
        ):
            self.tombstones += [(partition, t) for t in self.tracker.stale_counts(partition)]

    def _update_ready(self) -> None:
        behind = [
            p
            for p in self.assigned
            if (self.names.half, p) not in self.at_end or (self.names.op, p) not in self.at_end
        ]
        unread = self.instances.unread
        if self.assigned and not behind and unread is not None:
            self.health.set_ready(False, f"caught up, but {unread}")
        elif self.assigned and not behind:
            self.health.set_ready(True, "caught up")
        elif self.assigned:
            self.health.set_ready(False, f"reading partitions {sorted(behind)} to their end")
        elif self.consumer_errors.last is not None:
            self.health.set_ready(False, f"no partition assigned; {self.consumer_errors.last}")
        else:
            self.health.set_ready(False, "no partition assigned")

    def _caught_up(self, partitions: set[int]) -> set[int]:
        """Which of ``partitions`` have their op partition read to its end since assigned."""
        return {p for p in partitions if (self.names.op, p) in self.at_end}

    def _read_halves_to_end(self, partitions: set[int]) -> bool:
        """Before a COMMIT is written, read every half record the transaction can have.

        Its producer had every half acknowledged before its DB commit, and the commit came
        before the answer, so all of them lie below the half partition's high-watermark now
        (asked once per round, for every partition at once).
        """
        ends = end_offsets(self.admin, self.watermarks, self.names.half, partitions, timeout=10)
        if len(ends) < len(partitions):
            return False
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            positions = self.consumer.position([TopicPartition(self.names.half, p) for p in ends])
            if all(tp.offset >= ends[tp.partition] for tp in positions):
                return True
            messages = self.consumer.consume(1000, 0.2)
            for msg in messages:
                self._route(msg)
            self.clock.read(messages)
        return False

    # -- writing ---------------------------------------------------------------------------

    def _round(self) -> None:
        plan = self.round.plan(self.clock.now_ms())
        plan.states += [(p, t, None) for p, t in self.tombstones]
        due_commit = time.monotonic() - self.committed_at >= COMMIT_EVERY_S
        if not plan and not (due_commit and self.assigned):
            return
        with written(plan.spans):  # the decisions' spans end as the round is written
            self._commit(plan)

    def _commit(self, plan: RoundPlan) -> None:
        metadata = self.consumer.consumer_group_metadata()
        if not self.consumer.memberid():
            # Taken out of the group (its session timed out: frozen, paused): librdkafka then
            # forgets its member id and generation, and a transactional offset commit without
            # them is accepted by the broker, unfenced. Checked after the snapshot above: a
            # removal after it leaves the old generation in it, which the broker refuses.
            raise Restart("no longer a member of the group: this round is not written")
        try:
            self.writer.write(plan, self._offsets(), metadata)
        except RoundFailed:
            self.stats.write_failures += len(plan.ops) + len(plan.letters)
            raise
        self.stats.add(plan.counted)
        plan.log_written()
        self.tombstones = []
        self.committed_at = time.monotonic()
        self.tracker.prune()

    def _offsets(self) -> list[TopicPartition]:
        """The committed positions: the half offset never past a pending transaction's first
        record, the op offset with the floor its restart reads decisions from."""
        numbers = sorted(self.assigned)
        if not numbers:
            return []
        asked = [TopicPartition(t, p) for p in numbers for t in (self.names.half, self.names.op)]
        positions = {(tp.topic, tp.partition): tp.offset for tp in self.consumer.position(asked)}
        offsets = []
        for p in numbers:
            half = positions[(self.names.half, p)]
            op = positions[(self.names.op, p)]
            if half < 0 or op < 0:
                continue  # nothing read yet: the committed positions stand
            offsets.append(TopicPartition(self.names.half, p, self.tracker.half_floor(p, half)))
            floor = self.tracker.floor_ms(p)
            offsets.append(TopicPartition(self.names.op, p, op, metadata=progress_metadata(floor)))
        return offsets

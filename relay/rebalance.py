"""Partitions coming and going: assignment, revocation and loss in the consumer group.

On assignment the committed progress of each partition pair is read and its state rebuilt from
it (:mod:`relay.rebuild`) - unless this instance let the partition go at the revoke
just before and nothing was committed for it since, in which case its state is kept as it was
and read on from where this instance stopped.

The group's rebalances are eager (the range assignor): every instance lets go of all its
partitions, then gets its new share.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from confluent_kafka import Consumer, KafkaException, TopicPartition

from outbox.errors import OutboxError
from outbox.logs import fields
from relay.accounting import Accounting
from relay.commit_token import stamped_by_a_commit
from relay.flow_control import FlowControl
from relay.log_ends import LogEnds
from relay.partitions import Committed, Partitions
from relay.progress import Progress
from relay.settings import RelaySettings
from relay.state import PartitionState

log = logging.getLogger("relay")

#: A state let go of at a revoke, with what this instance had committed for it (None: nothing).
Retained = tuple[PartitionState, Committed | None]

#: Rebuilds the states of partition pairs from their committed progress
#: (:meth:`relay.rebuild.Rebuilder.rebuild`).
Rebuild = Callable[[Consumer, dict[int, Progress]], dict[int, PartitionState]]


class Rebalance:
    """One session's part in the group: the consumer's on_assign, on_revoke and on_lost."""

    def __init__(
        self,
        settings: RelaySettings,
        partitions: Partitions,
        *,
        rebuild: Rebuild,
        flow_control: FlowControl,
        ends: LogEnds,
        accounting: Accounting,
    ) -> None:
        self.settings = settings
        self.names = settings.topics
        self.partitions = partitions
        self.rebuild = rebuild
        self.flow_control = flow_control
        self.ends = ends
        self.accounting = accounting
        #: What failed while taking assigned partitions; the loop ends the session with it.
        self.callback_error: Exception | None = None
        #: States let go at the last revoke, with what this instance had committed for them:
        #: kept if the next assignment gives them back with nothing committed by others since.
        self.retained: dict[int, Retained] = {}
        #: How many times the group assigned this member partitions (none, for a standby): a
        #: new assignment may end a refusal (relay.readiness); whether the last was of none.
        self.assignments = 0
        self.given_nothing = False

    # -- the consumer's callbacks ----------------------------------------------------------

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # An exception must not escape a librdkafka callback: confluent-kafka re-raises it from
        # consume() as a bare KafkaError, which is no exception class and no handler catches
        # (a broker restart made the committed-offsets fetch fail with NOT_COORDINATOR and
        # killed the process). Keep it; the loop ends the session and starts a new one.
        self.assignments += 1
        self.given_nothing = not partitions
        try:
            self.assign(consumer, partitions)
        except (KafkaException, OutboxError) as err:
            self.callback_error = err

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.let_go(partitions, retain=True)

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Lost, not revoked: the group may have given them to another member already.
        self.let_go(partitions, retain=False)

    # -- assignment ------------------------------------------------------------------------

    def assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Take ``partitions``: keep or rebuild each state, then read from where it stands."""
        half = {tp.partition for tp in partitions if tp.topic == self.names.half}
        op = {tp.partition for tp in partitions if tp.topic == self.names.op}
        if half != op:
            log.error(
                "half partitions %s and op partitions %s differ: the topics need equal "
                "partition counts; only the common ones are handled",
                sorted(half),
                sorted(op),
            )
        self.partitions.assigned = (frozenset(half), frozenset(op))
        numbers = sorted(half & op)
        retained, self.retained = self.retained, {}
        states = self.partitions.states
        try:
            progress = self.read_progress(consumer, numbers)
            kept = self.kept(retained, progress)
        finally:
            for p, (state, _) in retained.items():
                if p not in states:
                    self.accounting.retire(state)
        rebuilding = {p: progress[p] for p in numbers if p not in kept}
        states.update(self.rebuild(consumer, rebuilding))
        for tp in partitions:
            # kept: where this instance stopped; rebuilt: the committed progress
            held = states.get(tp.partition)
            if held is not None:
                half_topic = tp.topic == self.names.half
                tp.offset = held.half_position if half_topic else held.op_read_position
        consumer.assign(partitions)
        log.info("assigned partitions %s (instance %s)", numbers, self.settings.instance_id)

    def kept(
        self, retained: dict[int, Retained], progress: dict[int, Progress]
    ) -> dict[int, PartitionState]:
        """Partitions given back right after this instance let them go, whose committed
        progress is still the one this instance committed: their states are kept as they were.

        A rebuild would re-read the op topic from the rebuild point and the state topic for
        each; a group that grows or shrinks would stall for that long. Every promotion, drop or
        put-back is committed with its progress in one Kafka transaction, none was open across
        the revoke (they begin and end inside one loop turn), and each commit's progress
        carries a token of its own (:mod:`relay.commit_token`). Another member may have held
        the partition in a generation this instance missed (left out while it was slow to
        rejoin, with no callback in between) and committed there, even without moving the
        offsets (a parked transaction promoted while an older one stays pending): its token
        differs. Any difference in the committed progress (another member's commit, or a stale
        read of it) sends the partition through the rebuild instead, and so does a progress
        with no token (an older relay's, in a group being upgraded: its next commit of the same
        offsets would read back the same).
        """
        kept = {}
        for p, (state, ours) in retained.items():
            if (
                p in progress
                and ours is not None
                and stamped_by_a_commit(ours[2])
                and self.partitions.committed.get(p) == ours
            ):
                kept[p] = state
                state.op_frontier.reassigned()  # ops may have come while it was let go
                self.partitions.states[p] = state
                log.info(
                    "partition %d kept across the rebalance: nothing committed since this "
                    "instance let it go (half from %d, op from %d)",
                    p,
                    state.half_position,
                    state.op_read_position,
                    extra=fields(partition=p),
                )
        return kept

    def let_go(self, partitions: list[TopicPartition], *, retain: bool) -> None:
        """Revoked (``retain``: kept aside for the next assignment) or lost."""
        states = self.partitions.states
        numbers = sorted({tp.partition for tp in partitions if tp.partition in states})
        self.partitions.assigned = (frozenset(), frozenset())
        for state, _ in self.retained.values():
            self.accounting.retire(state)
        self.retained = {}
        for p in numbers:
            state = states.pop(p)
            committed = self.partitions.committed.pop(p, None)
            if retain:
                self.retained[p] = (state, committed)
            else:
                self.accounting.retire(state)
            self.ends.forget(p)
            self.flow_control.forget(p)
        log.info(
            "%s partitions %s (instance %s)",
            "revoked" if retain else "lost",
            numbers,
            self.settings.instance_id,
        )

    def close(self) -> None:
        """The session ends: every state held or retained is retired and dropped."""
        for state in [*self.partitions.states.values(), *(s for s, _ in self.retained.values())]:
            self.accounting.retire(state)
        self.partitions.clear()
        self.retained = {}

    # -- the committed progress ------------------------------------------------------------

    def read_progress(self, consumer: Consumer, numbers: Iterable[int]) -> dict[int, Progress]:
        """The committed progress of the partition pairs ``numbers``, remembered as what this
        instance committed for them.

        Raises:
            KafkaException: a partition was answered with an error (nothing is remembered).
        """
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
            self.partitions.committed[p] = (at.half_offset, at.op_offset, op.metadata or "")
        return progress

"""What the relay counts: the states' counters as of each committed Kafka transaction, the
Kafka transactions aborted, and the lag of the committed offsets behind the partitions' ends.

The counters count what committed Kafka transactions wrote: a batch that is aborted and redone
is counted once, when it commits, and a partition another instance takes over is counted there.
"""

from __future__ import annotations

from confluent_kafka import Consumer, KafkaException, TopicPartition

from outbox.protocol.topics import TopicNames
from relay.actions import Counters
from relay.partitions import Partitions
from relay.state import PartitionState


class Accounting:
    """Totals over this instance's life, and its lag as of the loop's last look."""

    def __init__(self, names: TopicNames, partitions: Partitions) -> None:
        self.names = names
        self.partitions = partitions
        #: Kafka transactions aborted (their work is redone from the committed offsets).
        self.aborts = 0
        #: The state counters as of each partition's last committed Kafka transaction.
        self._counted: dict[str, int] = dict.fromkeys(vars(Counters()), 0)
        self._lag: dict[tuple[str, int], int] = {}
        #: When the lag was last measured (monotonic clock).
        self.lag_at = 0.0

    def count_committed(self) -> None:
        """Counters count what a committed Kafka transaction wrote: an aborted batch is
        redone from the committed progress and would otherwise count its promotions and drops
        again (and a partition let go of is counted by whoever redoes it)."""
        for state in self.partitions.states.values():
            counters = state.counters
            for key, value in vars(counters).items():
                if value:
                    self._counted[key] += value
            state.counters = type(counters)()

    def retire(self, state: PartitionState) -> None:
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

    def measure_lag(self, consumer: Consumer, now: float) -> None:
        """Records between each committed offset and its partition's end, as of ``now`` (on
        the loop's thread: the only one that may call into the consumer)."""
        lag = {}
        for p, (half, op, _) in list(self.partitions.committed.items()):
            for topic, committed in ((self.names.half, half), (self.names.op, op)):
                try:
                    _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)
                except KafkaException:
                    continue
                if high >= 0:  # (-1001 before the partition's first fetch: not known)
                    lag[(topic, p)] = max(int(high) - committed, 0)
        self._lag = lag
        self.lag_at = now

"""``max_queued_ops``: reading an op partition pauses while its queue of ops waiting for their
half records is long, and resumes once half of them are handled.

librdkafka drops what it fetched for a paused partition and fetches again from the
application's position on resume, so pausing loses nothing (``tests/relay/test_flow_control.py``
reads a backlog through many pauses).
"""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import Consumer, TopicPartition

from relay.state import PartitionState


class FlowControl:
    """Which op partitions are paused, and the rule that pauses and resumes them."""

    def __init__(self, op_topic: str, max_queued_ops: int) -> None:
        self.op_topic = op_topic
        self.max_queued_ops = max_queued_ops
        #: Op partitions paused now.
        self.paused: set[int] = set()

    def update(self, consumer: Consumer, states: Mapping[int, PartitionState]) -> None:
        """Pause reading an op partition whose queue is long; resume it once it drained."""
        limit = self.max_queued_ops
        for p, state in states.items():
            tp = [TopicPartition(self.op_topic, p)]
            if p not in self.paused and len(state.queue) > limit:
                consumer.pause(tp)
                self.paused.add(p)
            elif p in self.paused and len(state.queue) <= limit // 2:
                consumer.resume(tp)
                self.paused.discard(p)

    def forget(self, partition: int) -> None:
        """The partition was let go of: it counts as not paused from now on."""
        self.paused.discard(partition)

    def clear(self) -> None:
        """The session ended, and its consumer with it."""
        self.paused = set()

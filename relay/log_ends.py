"""Where each half partition ends, as the relay knows it.

A partition's state needs its half partition's end for two reasons: an op naming records at or
past the end can never be carried out (the producers write their half records before their op),
and copies of decided transactions may lie ahead of the reader up to the end (the rebuild point
must wait until the reader passed it). The consumer's last fetch says where the end was, and
put-back copies this relay wrote move it on before the consumer has seen them. A verified end is
the high watermark (``outbox.watermarks``): the relay's own read_committed consumer would answer
with the last stable offset, below acknowledged half records when a Kafka transaction is open on
the partition, and their COMMIT would be rejected.
"""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaException, TopicPartition

from outbox.watermarks import Watermarks
from relay.state import PartitionState

#: An op waiting this long for its half records makes the relay ask the broker whether they
#: can exist at all (an op naming offsets past the partition's end is rejected).
VERIFY_AFTER_S = 5.0


class LogEnds:
    """The half partitions' ends: as last fetched, past the last copy put back, or verified."""

    def __init__(self, half_topic: str, *, verify_after_s: float = VERIFY_AFTER_S) -> None:
        self.half_topic = half_topic
        self.verify_after_s = verify_after_s
        #: Half partition -> the offset past the last put-back copy this relay wrote there.
        self.copies_end: dict[int, int] = {}
        #: Half partition -> since when the op at the head of its queue waits past the end.
        self._waiting_since: dict[int, float] = {}

    def copied(self, partition: int, end: int) -> None:
        """A put-back copy was written: ``partition`` reaches at least to ``end``."""
        if end > self.copies_end.get(partition, 0):
            self.copies_end[partition] = end

    def log_end(self, consumer: Consumer, partition: int) -> int:
        """The half partition's end as known here: the consumer's last fetch, or past the last
        copy this relay put back, whichever is further."""
        try:
            _, high = consumer.get_watermark_offsets(
                TopicPartition(self.half_topic, partition), cached=True
            )
        except KafkaException:
            high = 0
        return max(int(high), self.copies_end.get(partition, 0))

    def verified_end(
        self, consumer: Consumer, watermarks: Watermarks, partition: int, state: PartitionState
    ) -> int | None:
        """The half partition's high watermark from the broker, when the op at the head has
        waited a while for records at or past the end as last seen by ``consumer`` (an op
        naming records that exist just waits for the reader, which is the common case while
        catching up)."""
        op = state.waiting_op()
        if op is None or max(op.half_offsets, default=-1) < self.log_end(consumer, partition):
            self._waiting_since.pop(partition, None)
            return None
        since = self._waiting_since.setdefault(partition, time.monotonic())
        if time.monotonic() - since < self.verify_after_s:
            return None
        self._waiting_since[partition] = time.monotonic()
        try:
            _, high = watermarks.query(self.half_topic, partition, timeout=5)
        except KafkaException:
            return None
        return high

    def forget(self, partition: int) -> None:
        """The partition was let go of: an op of its next owner waits from scratch."""
        self._waiting_since.pop(partition, None)

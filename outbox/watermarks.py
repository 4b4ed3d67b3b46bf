"""Where a partition starts and ends as its broker has it, for clients that read with
``read_committed``.

Such a consumer's own watermark query (``get_watermark_offsets(cached=False)``) answers with
the partition's *last stable offset* as its end: the first offset of the oldest Kafka
transaction still open there. On a half partition that is a relay's put-back copies, until that
relay commits, or until the transaction times out after the relay died; the half records
producers wrote and had acknowledged after them lie above it. Taken for the end, it says those
records do not exist: a relay would reject a COMMIT naming them as "past the end" (the
transaction dead-lettered, never delivered), a checker would take its read of the half
partition for complete. This client reads uncommitted and is only asked, never assigned: its
end is the high watermark, below which every record the ISR acknowledged lies (the producers
write with ``acks=all``).
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer, TopicPartition

from outbox.kafka_logging import log_to_python


class Watermarks:
    """Asks the brokers for partitions' log start and high watermark (uncommitted records
    counted), through a consumer of its own that never reads.

    Args:
        config: the shared client settings (``bootstrap.servers`` and the user's keys).
    """

    def __init__(self, config: dict[str, Any]) -> None:
        self._consumer = Consumer(
            log_to_python(
                {
                    **config,
                    "group.id": "outbox-watermarks",  # never joined: the client needs a name
                    "enable.auto.commit": False,
                    "isolation.level": "read_uncommitted",
                }
            )
        )

    def query(self, topic: str, partition: int, timeout: float) -> tuple[int, int]:
        """``(log start, high watermark)`` of the partition, asked of its leader now.

        Raises:
            KafkaException: no answer in ``timeout`` seconds (the leader is moving or down).
        """
        low, high = self._consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=timeout, cached=False
        )
        return int(low), int(high)

    def close(self) -> None:
        self._consumer.close()

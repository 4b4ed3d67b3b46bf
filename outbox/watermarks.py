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

A client that is only asked keeps what it once learnt of a topic's partitions and leaders:
librdkafka refreshes the metadata of topics a client reads or writes, not of those it only
queries. When that metadata goes wrong, every query fails at once ("Local: Unknown partition")
until the entry expires (``metadata.max.age.ms``, 15 minutes by default): after a partition was
added, and on a three-broker cluster after brokers were killed and restarted, where a checker
that could not learn a half partition's end then applied none of its answers for minutes
(docs/clusters.md). So a query that fails replaces the client with a fresh one, which asks the
brokers anew; at most once per ``renew_after_s``, since a broker that is down fails every client.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from outbox.kafka_logging import log_to_python
from outbox.logs import fields

log = logging.getLogger("outbox")


class Watermarks:
    """Asks the brokers for partitions' log start and high watermark (uncommitted records
    counted), through a consumer of its own that never reads.

    Args:
        config: the shared client settings (``bootstrap.servers`` and the user's keys).
        renew_after_s: the least time between two replacements of the client after failed
            queries.
    """

    def __init__(self, config: dict[str, Any], *, renew_after_s: float = 5.0) -> None:
        self._config = log_to_python(
            {
                **config,
                "group.id": "outbox-watermarks",  # never joined: the client needs a name
                "enable.auto.commit": False,
                "isolation.level": "read_uncommitted",
            }
        )
        self._renew_after_s = renew_after_s
        self._lock = threading.Lock()
        self._consumer = Consumer(self._config)
        self._made = time.monotonic()
        self.renewals = 0
        """How many times a failed query replaced the client."""

    def query(self, topic: str, partition: int, timeout: float) -> tuple[int, int]:
        """``(log start, high watermark)`` of the partition, asked of its leader now.

        Raises:
            KafkaException: no answer in ``timeout`` seconds (the leader is moving or down), or
                the client's metadata says the partition does not exist (the next query, after
                ``renew_after_s``, is asked by a fresh client).
        """
        with self._lock:
            try:
                low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=timeout, cached=False
                )
            except KafkaException as err:
                self._renew(topic, partition, err)
                raise
        return int(low), int(high)

    def _renew(self, topic: str, partition: int, err: KafkaException) -> None:
        if time.monotonic() - self._made < self._renew_after_s:
            return
        log.warning(
            "watermarks of %s [%d] not known (%s): asking with a fresh client from now on",
            topic,
            partition,
            err.args[0].str() if err.args else err,
            extra=fields(topic=topic, partition=partition),
        )
        stale, self._consumer = self._consumer, Consumer(self._config)
        self._made = time.monotonic()
        self.renewals += 1
        stale.close()

    def close(self) -> None:
        with self._lock:
            self._consumer.close()

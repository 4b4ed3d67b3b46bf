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
queries. When the entry it holds names no leader for the partition, or a leader it no longer
knows (a broker missing from a later metadata response is dropped), or lacks the partition,
librdkafka fails the query at once ("Local: Unknown partition") without asking a broker - so no
broker's error refreshes the entry either - until the entry expires (``metadata.max.age.ms``, 15
minutes by default). That happened to a checker on a three-broker cluster after brokers were
killed and restarted: it could not learn a half partition's end, so it applied none of its
answers for minutes (docs/clusters.md). So a failed query replaces the client with a fresh one,
which asks the brokers anew. Any failure, not only that one: a query that waits on a broker that
is down fails after its timeout with any client, and a fresh client costs a connection.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from outbox import kafka_clients
from outbox.closing import close_each
from outbox.logs import fields

log = logging.getLogger("outbox")


class Watermarks:
    """Asks the brokers for partitions' log start and high watermark (uncommitted records
    counted), through a consumer of its own that never reads.

    Args:
        config: the shared client settings (``bootstrap.servers`` and the user's keys).
        renew_after_s: how old the client must be before a failed query replaces it: a client
            is replaced at most once in that time, and not in its first ``renew_after_s``.
    """

    def __init__(self, config: dict[str, Any], *, renew_after_s: float = 5.0) -> None:
        self._config = {
            **config,
            "group.id": "outbox-watermarks",  # never joined: the client needs a name
            "enable.auto.commit": False,
            "isolation.level": "read_uncommitted",
        }
        self._renew_after_s = renew_after_s
        self._lock = threading.Lock()
        self._consumer = kafka_clients.consumer(self._config)
        self._made = time.monotonic()
        #: How many times a failed query replaced the client.
        self.renewals = 0

    def query(self, topic: str, partition: int, timeout: float) -> tuple[int, int]:
        """``(log start, high watermark)`` of the partition, asked of its leader now.

        Raises:
            KafkaException: no answer in ``timeout`` seconds (the leader is moving or down), or
                the client's metadata names no leader it knows (the next query, once the client
                is ``renew_after_s`` old, is asked by a fresh client), or an answer without a
                high watermark (negative).
        """
        stale = None
        try:
            with self._lock:
                try:
                    low, high = self._consumer.get_watermark_offsets(
                        TopicPartition(topic, partition), timeout=timeout, cached=False
                    )
                    if high < 0:  # not known: an end every read position passes is no answer
                        raise KafkaException(
                            KafkaError(
                                KafkaError._FAIL,
                                f"high watermark of {topic} [{partition}] not known ({high})",
                            )
                        )
                except KafkaException as err:
                    stale = self._renew(topic, partition, err)
                    raise
        finally:
            if stale is not None:  # its queued librdkafka log comes out here
                close_each([stale.close], log)
        return int(low), int(high)

    def _renew(self, topic: str, partition: int, err: KafkaException) -> Consumer | None:
        """The client replaced by a fresh one, if it is old enough: the stale one, to close."""
        if time.monotonic() - self._made < self._renew_after_s:
            return None
        self._made = time.monotonic()  # a client that cannot be made is tried again later
        reason = err.args[0].str() if err.args else str(err)
        try:
            fresh = kafka_clients.consumer(self._config)
        except Exception as failed:  # the query's own error is what the caller handles
            log.warning(
                "watermarks of %s [%d] not known (%s), and no fresh client: %s",
                topic,
                partition,
                reason,
                failed,
                extra=fields(topic=topic, partition=partition),
            )
            return None
        log.warning(
            "watermarks of %s [%d] not known (%s): asking with a fresh client from now on",
            topic,
            partition,
            reason,
            extra=fields(topic=topic, partition=partition),
        )
        stale, self._consumer = self._consumer, fresh
        self.renewals += 1
        return stale

    def close(self) -> None:
        with self._lock:
            self._consumer.close()

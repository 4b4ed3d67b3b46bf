"""Which real topics exist, so a COMMIT for a missing topic is parked instead of aborting a
whole Kafka transaction (or, with the broker's auto-create on, creating topics by accident)."""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from outbox.kafka_logging import log_to_python

log = logging.getLogger("relay")


class TopicCache:
    """Topic names from cluster metadata, refreshed every ``refresh_s`` and, at most every
    ``miss_refresh_s``, when a name is not found."""

    def __init__(
        self,
        config: dict[str, Any],
        *,
        refresh_s: float = 30.0,
        miss_refresh_s: float = 5.0,
        auto_create: bool = False,
        auto_create_partitions: int = -1,
    ) -> None:
        self._admin = AdminClient(log_to_python(config))
        self.refresh_s = refresh_s
        self.miss_refresh_s = miss_refresh_s
        self.auto_create = auto_create
        self.auto_create_partitions = auto_create_partitions
        self._topics: set[str] = set()
        self._at = float("-inf")

    def exists(self, topic: str) -> bool:
        now = time.monotonic()
        if topic in self._topics and now - self._at <= self.refresh_s:
            return True  # the hot path: once per promoted record
        if now - self._at > self.refresh_s or (
            topic not in self._topics and now - self._at > self.miss_refresh_s
        ):
            self._refresh()
        if topic not in self._topics and self.auto_create:
            self._create(topic)
        return topic in self._topics

    def _refresh(self) -> None:
        try:
            metadata = self._admin.list_topics(timeout=10)
        except KafkaException as err:
            log.warning("cannot refresh topic metadata: %s", err)
            return
        finally:
            self._admin.poll(0)  # its librdkafka log comes out only here (outbox.kafka_logging)
        self._topics = {n for n, t in metadata.topics.items() if t.error is None}
        self._at = time.monotonic()

    def _create(self, topic: str) -> None:
        new = NewTopic(topic, num_partitions=self.auto_create_partitions, replication_factor=-1)
        try:
            self._admin.create_topics([new])[topic].result(30)
            log.info("created real topic %s (auto_create_topics is on)", topic)
        except KafkaException as err:
            if err.args[0].code() != 36:  # TOPIC_ALREADY_EXISTS: someone else made it
                log.error("cannot create real topic %s: %s", topic, err)
                return
        finally:
            self._admin.poll(0)
        self._topics.add(topic)

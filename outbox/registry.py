"""Heartbeats of a producer instance to the registry topic, so the checker can find it."""

from __future__ import annotations

import logging
import os
import threading
import uuid

from confluent_kafka import Producer

from outbox.forking import keep
from outbox.kafka_logging import log_to_python
from outbox.protocol.registry import Registration, encode_registration
from outbox.settings import OutboxSettings

log = logging.getLogger("outbox")


def new_instance_id() -> str:
    """A fresh producer instance id (12 hex digits)."""
    return uuid.uuid4().hex[:12]


class Heartbeat:
    """Announces ``check_url`` every ``interval_s`` until ``close()``, which tombstones it.

    In a process forked from the one that made it (:mod:`outbox.forking`), ``close()`` lets go
    of it without a tombstone: the announcing thread and the Kafka client's threads are the
    parent's, whose endpoint goes on answering under this registration.
    """

    def __init__(
        self,
        settings: OutboxSettings,
        check_url: str,
        *,
        version: str,
        interval_s: float = 5.0,
        instance_id: str | None = None,
    ) -> None:
        self.registration = Registration(
            settings.producer_group, instance_id or new_instance_id(), check_url, version
        )
        self.topic = settings.topics.registry
        self.interval_s = interval_s
        self._producer: Producer | None = Producer(
            log_to_python({"bootstrap.servers": settings.bootstrap_servers, **settings.kafka})
        )
        self._stop = threading.Event()
        self._pid = os.getpid()
        self._beat()
        self._thread = threading.Thread(target=self._run, name="outbox-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        producer = self._producer
        if producer is None:
            return  # closed
        key, value = encode_registration(self.registration)
        producer.produce(self.topic, key=key, value=value)
        producer.poll(0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._beat()
            except Exception:  # a heartbeat must never take the producer down
                log.exception("heartbeat to %s failed", self.topic)

    def close(self) -> None:
        """Tombstone the registration (waiting up to 5 s for it) and let go of the producer, so
        that nothing of it stays connected to the broker whoever still holds this object. In a
        forked process, only let go: the client is the parent's (its connections are the
        parent's, and stay)."""
        producer, self._producer = self._producer, None
        if producer is None:
            return
        if os.getpid() != self._pid:
            keep(producer)  # destroying it would wait for threads that are not in this process
            return
        self._stop.set()
        self._thread.join(5)
        producer.produce(self.topic, key=self.registration.key, value=None)
        producer.flush(5)

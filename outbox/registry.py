"""Heartbeats of a producer instance to the registry topic, so the checker can find it.

A heartbeat Kafka refuses is the one failure the producer does not feel: its transactions go on,
and only later, when the checker finds no live instance of the group and gives up its undecided
transactions after ``no_producer_timeout_s``, does a committed one end in the dead letters
instead of its topic. So the first heartbeat is waited for: refused for want of an ACL, the
check endpoint does not start (:class:`~outbox.errors.ConfigurationError` naming the topic and
the ACL). Refused later (an ACL taken away), each cause is logged once as an error, counted
(``outbox_producer_heartbeats_failed_total``), and its end logged.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from outbox import kafka_clients
from outbox.errors import ConfigurationError
from outbox.forking import keep
from outbox.kafka_permissions import grant_hint, not_allowed
from outbox.protocol.registry import Registration, encode_registration
from outbox.settings import OutboxSettings

if TYPE_CHECKING:
    from outbox.metrics import ProducerMetrics

log = logging.getLogger("outbox")


def new_instance_id() -> str:
    """A fresh producer instance id (12 hex digits)."""
    return uuid.uuid4().hex[:12]


class Heartbeat:
    """Announces ``check_url`` every ``interval_s`` until ``close()``, which tombstones it.

    In a process forked from the one that made it (:mod:`outbox.forking`), ``close()`` lets go
    of it without a tombstone: the announcing thread and the Kafka client's threads are the
    parent's, whose endpoint goes on answering under this registration.

    Raises:
        ConfigurationError: Kafka refused the first heartbeat for want of an ACL (waited for up
            to ``first_wait_s``; a broker slow to answer only delays start-up that long).
    """

    def __init__(
        self,
        settings: OutboxSettings,
        check_url: str,
        *,
        version: str,
        interval_s: float = 5.0,
        instance_id: str | None = None,
        metrics: ProducerMetrics | None = None,
        first_wait_s: float = 5.0,
    ) -> None:
        self.registration = Registration(
            settings.producer_group, instance_id or new_instance_id(), check_url, version
        )
        self.topic = settings.topics.registry
        self.interval_s = interval_s
        self._producer: Producer | None = kafka_clients.producer(
            {"bootstrap.servers": settings.bootstrap_servers, **settings.kafka}
        )
        self._stop = threading.Event()
        self._pid = os.getpid()
        self._metrics = metrics
        #: The Kafka error heartbeats fail with, while they do (logged once per cause).
        self.failing: KafkaError | None = None
        #: Refusals are raised, not logged, while the first heartbeat is waited for.
        self._starting = True
        try:
            self._beat()
            self._producer.flush(first_wait_s)
        except BaseException:  # interrupted: nothing would ever close the client
            self._producer = None
            raise
        self._starting = False
        refused = self.failing
        if refused is not None and not_allowed(refused):
            self._producer = None  # its only reference: the client goes now, not with the error
            raise self._not_allowed(refused)
        self._thread = threading.Thread(target=self._run, name="outbox-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        producer = self._producer
        if producer is None:
            return  # closed
        key, value = encode_registration(self.registration)
        try:
            producer.produce(self.topic, key=key, value=value, on_delivery=self._delivered)
        except KafkaException as err:  # refused at once: the topic's metadata says so
            self._delivered(err.args[0], None)
        producer.poll(0)

    def _not_allowed(self, refused: KafkaError) -> ConfigurationError:
        return ConfigurationError(
            f"Kafka refused this producer's heartbeat to the registry topic {self.topic} "
            f"({refused.str()}){grant_hint(refused, self.topic)}. Without heartbeats the "
            f"checker finds no live instance of group {self.registration.group!r} and gives "
            "up its undecided transactions after no_producer_timeout_s"
        )

    def _delivered(self, err: KafkaError | None, msg: Message | None) -> None:
        if err is None:
            if self.failing is not None:
                log.info("heartbeats reach the registry topic %s again", self.topic)
                self.failing = None
            return
        if self._metrics is not None:
            self._metrics.heartbeat_failed(err.name())
        quiet = self._starting and not_allowed(err)  # raised by the constructor instead
        if not quiet and (self.failing is None or self.failing.code() != err.code()):
            log.error(
                "a heartbeat of producer group %r did not reach the registry topic %s (%s)%s: "
                "until one does, the checker cannot find this check endpoint",
                self.registration.group,
                self.topic,
                err.str(),
                grant_hint(err, self.topic),
            )
        self.failing = err

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

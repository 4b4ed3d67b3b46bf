"""Which real topics the relay can write to, so a COMMIT for a missing topic, or one the relay's
principal may not write to, is parked instead of aborting a whole Kafka transaction (or, with
the broker's auto-create on, creating topics by accident).

A topic the principal may describe but not write to would pass a look at the topic list, and
the broker would refuse it only when the relay adds it to a Kafka transaction: that refusal
names no record, so every batch of the instance would be aborted and redone until the ACL is
granted. So a topic is also described with the operations Kafka says the principal may do on it
(KIP-430's authorized operations), once when the relay first writes to it and again at each
refresh of the list.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AclOperation, NewTopic  # type: ignore[attr-defined]

from outbox import kafka_clients

log = logging.getLogger("relay")

#: The operations that let a principal write to a topic (ALL, when a broker reports it as such).
_WRITES = frozenset({AclOperation.WRITE, AclOperation.ALL})


class TopicCache:
    """Topic names from cluster metadata, refreshed every ``refresh_s`` and, at most every
    ``miss_refresh_s``, when a name is not found; and whether the relay may write to each topic
    it asks about: asked once, again at each full refresh (every ``refresh_s``, all in one
    request), and at most every ``miss_refresh_s`` while it may not.

    The relay keeps one for its life, across sessions (a session ends at every aborted batch).
    ``admin`` is the client to ask (default: one made from ``config``), ``touch`` is called
    after each request (the relay's liveness: a slow authorizer must not look like a hung
    relay), ``clock`` is monotonic seconds.
    """

    def __init__(
        self,
        config: dict[str, Any],
        *,
        refresh_s: float = 30.0,
        miss_refresh_s: float = 5.0,
        auto_create: bool = False,
        auto_create_partitions: int = -1,
        admin: Any = None,
        touch: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._admin = admin if admin is not None else kafka_clients.admin(config)
        self.refresh_s = refresh_s
        self.miss_refresh_s = miss_refresh_s
        self.auto_create = auto_create
        self.auto_create_partitions = auto_create_partitions
        self._touch = touch
        self._clock = clock
        self._topics: set[str] = set()
        self._writable: set[str] = set()  # asked about, and the relay may write to them
        self._denied: dict[str, float] = {}  # asked about, and it may not: since when
        self._create_tried: dict[str, float] = {}  # auto-create refused: since when
        # two clocks: a missing topic's quick listings must not put off the full refresh
        self._listed_at = float("-inf")  # the last listing (tried)
        self._checked_at = float("-inf")  # the last full refresh (tried)

    def unwritable(self, topic: str) -> str | None:
        """None when the relay can write to ``topic`` now; else why not, and what to do."""
        now = self._clock()
        if topic in self._writable and now - self._checked_at <= self.refresh_s:
            return None  # the hot path: once per real topic per batch (relay.refusals)
        if now - self._checked_at > self.refresh_s:
            self._refresh(now, full=True)
        elif topic not in self._topics and now - self._listed_at > self.miss_refresh_s:
            self._refresh(now, full=False)
        if (
            topic not in self._topics
            and self.auto_create
            and self._may_try(self._create_tried, topic, now)
        ):
            self._create(topic, now)
        if (
            topic in self._topics
            and topic not in self._writable
            and self._may_try(self._denied, topic, now)
        ):
            self._ask(topic, now)
        if topic not in self._topics:
            return (
                f"topic {topic} does not exist, or the relay may not see it: create it (or set "
                "auto_create_topics), or grant the relay's principal Write on it"
            )
        if topic not in self._writable:
            return (
                f"the relay may not write to topic {topic}: grant the relay's principal Write on it"
            )
        return None

    def _may_try(self, refused: dict[str, float], topic: str, now: float) -> bool:
        """Whether to ask Kafka again for ``topic``: not refused, or more than
        ``miss_refresh_s`` ago."""
        since = refused.get(topic)
        return since is None or now - since > self.miss_refresh_s

    def _ask(self, topic: str, now: float) -> None:
        """Whether the relay may write to ``topic``, asked now."""
        if self._may_write([topic]):
            self._writable.add(topic)
            self._denied.pop(topic, None)
        elif topic in self._topics:  # (one Kafka no longer knows has left the list)
            self._denied[topic] = now

    def _refresh(self, now: float, *, full: bool) -> None:
        """The topic list again; ``full``: and whether the relay may still write to the topics
        it may write to (an ACL taken away since), all in one request. A failed listing is
        tried again after ``miss_refresh_s``, what was known kept meanwhile."""
        self._listed_at = now
        if full:
            self._checked_at = now
        try:
            metadata = self._admin.list_topics(timeout=10)
        except KafkaException as err:
            log.warning("cannot refresh topic metadata: %s", err)
            if full:  # the next full refresh in miss_refresh_s, not at the next call
                self._checked_at = now - self.refresh_s + self.miss_refresh_s
            return
        finally:
            self._admin.poll(0)  # its librdkafka log comes out only here (outbox.kafka_logging)
            self._touch()
        self._topics = {n for n, t in metadata.topics.items() if t.error is None}
        self._writable &= self._topics
        if full and self._writable:
            before = self._writable
            self._writable = self._may_write(sorted(before))
            for taken_away in before - self._writable:
                if taken_away in self._topics:
                    self._denied[taken_away] = now

    def _may_write(self, topics: list[str]) -> set[str]:
        """Those of ``topics`` the relay may write to, by the operations Kafka reports for its
        principal. A topic Kafka refuses to describe may not be written to; one it does not
        know is left out of the topic list. When Kafka does not say (a broker before 2.3, a
        timeout, another error), a topic counts as writable: the write itself then tells, as
        it did before this look."""
        try:
            futures = self._admin.describe_topics(
                TopicCollection(topics), request_timeout=5, include_authorized_operations=True
            )
        except KafkaException as err:
            log.warning("cannot describe topics %s: %s", ", ".join(topics), err)
            return set(topics)
        finally:
            self._admin.poll(0)
        allowed: set[str] = set()
        try:
            for name, future in futures.items():
                try:
                    operations = future.result(timeout=5).authorized_operations
                except KafkaException as err:
                    code = err.args[0].code()
                    if code == KafkaError.UNKNOWN_TOPIC_OR_PART:
                        self._topics.discard(name)
                    elif code != KafkaError.TOPIC_AUTHORIZATION_FAILED:
                        log.warning("cannot describe topic %s: %s", name, err)
                        allowed.add(name)
                    continue
                except TimeoutError:
                    log.warning("topic %s not described within 5 s", name)
                    allowed.add(name)
                    continue
                if operations is None or _WRITES & set(operations):
                    allowed.add(name)
        finally:
            self._admin.poll(0)
            self._touch()
        return allowed

    def _create(self, topic: str, now: float) -> None:
        new = NewTopic(topic, num_partitions=self.auto_create_partitions, replication_factor=-1)
        try:
            self._admin.create_topics([new])[topic].result(30)
            log.info("created real topic %s (auto_create_topics is on)", topic)
        except KafkaException as err:
            if err.args[0].code() != 36:  # TOPIC_ALREADY_EXISTS: someone else made it
                log.error("cannot create real topic %s: %s", topic, err)
                self._create_tried[topic] = now  # tried again after miss_refresh_s
                return
        except TimeoutError:  # (not a KafkaException: it ended the relay)
            log.error("cannot create real topic %s: Kafka did not answer within 30 s", topic)
            self._create_tried[topic] = self._clock()  # 30 s after now: not at once again
            return
        finally:
            self._admin.poll(0)
            self._touch()
        self._create_tried.pop(topic, None)
        self._topics.add(topic)

"""A service's consumer errors, said with what to do, not dropped and not repeated.

A relay or checker reads the half and op topics as a consumer-group member. The errors its
consumer returns (its group or a topic its principal may not read) are what tells an operator
why it reads nothing: the checker used to drop them all (it logged nothing and its readiness
said only "no partition assigned"), the relay logged each without saying which ACL to grant.
librdkafka reports some again on every retry of their request, so they are counted as its own
repeated log lines are (:mod:`outbox.log_repeats`): one like a line logged less than a minute
before is counted, and the count logged with the next one after the minute, by the loop's
:meth:`ConsumerErrors.tick` a minute after the error stopped, when the checker's partitions
change, or when the session ends (:meth:`ConsumerErrors.flush`).

librdkafka says some refusals once, not on each retry (its group's, a topic left out of its
subscription), so the last refusal is kept (:attr:`ConsumerErrors.refused`) until the consumer
reads the topic it named to its end (:meth:`ConsumerErrors.read_to_end`), Kafka takes what it
refused (:meth:`ConsumerErrors.refusal_over`) or the service clears it
(:meth:`ConsumerErrors.clear`). The relay's readiness reads it (:mod:`relay.readiness`); the
checker's says :attr:`ConsumerErrors.last` while it has no partition.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import KafkaError

from outbox.kafka_permissions import member_hint
from outbox.log_repeats import Repeats, log_lines

#: How a consumer error is logged: its text, with what to grant.
_FORMAT = "consumer error: %s"


class ConsumerErrors:
    """The consumer errors of one member (``service``: "relay" or "checker", in group
    ``group_id``, reading ``topics``), logged to ``log``; :attr:`last` is the last one, with
    what to grant, and :attr:`refused` the last refusal (an ACL missing), each until
    :meth:`clear` (for readiness)."""

    def __init__(
        self,
        service: str,
        group_id: str,
        topics: tuple[str, ...],
        log: logging.Logger,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.service = service
        self.group_id = group_id
        self.topics = topics
        self.log = log
        self.clock = clock
        self.repeats = Repeats(clock=clock)
        self.last: str | None = None
        self.refused: str | None = None
        #: The topic :attr:`refused` names (None: the group, or every topic read).
        self.refused_topic: str | None = None
        self._ticked = clock()

    def report(self, error: KafkaError, topic: str | None = None) -> str:
        """Say ``error`` (of ``topic``, if the consumer named one), or count it if one like it
        was said within the minute; the text, with what to grant."""
        named = (topic,) if topic else self.topics
        hint = member_hint(error, self.service, self.group_id, named)
        text = f"{error.str()}{hint}"
        self.last = text
        if hint:
            self.refused, self.refused_topic = text, topic
        lines, _ = self.repeats.admit(text, logging.WARNING, (text,))
        log_lines(self.log, _FORMAT, lines)
        return text

    def read_to_end(self, topic: str) -> None:
        """The consumer read a partition of ``topic`` to its end: a refusal of that topic is
        over (not one of the group, nor one naming no topic). Called at a partition's end, not
        per record."""
        if self.refused is not None and self.refused_topic == topic:
            self.refused = self.refused_topic = None

    def refusal_over(self) -> None:
        """Kafka took what a refusal refused (the relay's Kafka transaction sent both topics'
        offsets to the group): it is over."""
        self.refused = self.refused_topic = None

    def tick(self) -> None:
        """Once a window has passed since the last: log the counts of errors that stopped
        (a refusal granted away), not left for the session's end. One clock read a call, for
        a service's loop to call each turn."""
        now = self.clock()
        if now - self._ticked >= self.repeats.window_s:
            self._ticked = now
            log_lines(self.log, _FORMAT, self.repeats.sweep())

    def clear(self) -> None:
        """The member's partitions changed: the last error and refusal no longer say why it has
        none (the counts held are logged: :meth:`flush`)."""
        self.last = None
        self.refused = self.refused_topic = None
        self.flush()

    def flush(self) -> None:
        """Log the counts held back (at a session's end: nothing is left uncounted)."""
        log_lines(self.log, _FORMAT, self.repeats.sweep(everything=True))

"""A service's consumer errors, said once with what to do, not dropped and not repeated.

A relay or checker reads the half and op topics as a consumer-group member. The errors its
consumer returns (a group or topic its principal may not read, a JoinGroup refusal) are what
tells an operator why it reads nothing: the checker used to drop them all (it logged nothing and
its readiness said only "no partition assigned"), the relay logged each without saying which ACL
to grant. Some come back on every retry of their request - a JoinGroup refused for want of Read
on the group, about every 2 s - so a line like the last one logged is counted, and logged again
with its count once :data:`~outbox.log_repeats.REPEAT_WINDOW_S` has passed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import KafkaError

from outbox.kafka_permissions import member_hint
from outbox.log_repeats import REPEAT_WINDOW_S


class ConsumerErrors:
    """The consumer errors of one member (``service``: "relay" or "checker", in group
    ``group_id``, reading ``topics``), logged to ``log``; :attr:`last` is the last one, with
    what to grant, until :meth:`clear` (for readiness)."""

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
        self.last: str | None = None
        self._logged_at = 0.0
        self._like_it = 0

    def report(self, error: KafkaError, topic: str | None = None) -> str:
        """Say ``error`` (of ``topic``, if the consumer named one) unless it is the one logged
        last, within the window (then it is counted); the text, with what to grant."""
        named = (topic,) if topic else self.topics
        text = f"{error.str()}{member_hint(error, self.service, self.group_id, named)}"
        now = self.clock()
        if text == self.last and now - self._logged_at < REPEAT_WINDOW_S:
            self._like_it += 1
            return text
        if text == self.last and self._like_it:
            self.log.warning(
                "consumer error: %s (%d like it in the %.0f s before)",
                text,
                self._like_it,
                now - self._logged_at,
            )
        else:
            self.log.warning("consumer error: %s", text)
        self.last, self._logged_at, self._like_it = text, now, 0
        return text

    def clear(self) -> None:
        """Partitions were assigned, or taken away: the last error no longer says why."""
        self.last, self._like_it = None, 0

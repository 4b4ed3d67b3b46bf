"""The librdkafka settings of a service's consumer-group member: a relay's or a checker's
consumer of the half and op topics. One place, so the two read the topics alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def group_member_config(
    group_id: str, kafka: Mapping[str, Any], defaults: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The member's settings: ``defaults`` (the service's own), then ``kafka`` (the user's,
    over both), then what the protocol needs whatever either says.

    - ``session.timeout.ms`` 10 s and ``heartbeat.interval.ms`` 1 s, not librdkafka's 45 s: a
      member whose session ended without leaving the group (its broker away, its process
      killed) holds its partitions, unread, until the group drops it. Heartbeats come from
      librdkafka's own thread, so a long loop turn misses none; a stalled loop is
      ``max.poll.interval.ms``'s to find. The ``kafka`` settings may set either (a value the
      brokers refuse ends the service: :mod:`outbox.refused_settings`).
    - ``topic.metadata.refresh.interval.ms`` 10 s, not librdkafka's 5 minutes: a half or op
      topic the member could not see (an ACL granted since, a topic made after it started) is
      left out of its subscription until its metadata is read again, and it reads nothing of
      it meanwhile. One Metadata request every 10 s is nothing to a broker; librdkafka's
      ``metadata.max.age.ms`` follows (3 times it: 30 s) unless set. A topic's partition count
      changed or a topic deleted is seen as soon (a rebalance).
    - ``range`` assignment: a half partition and the op partition of the same number go to the
      same member (the co-partitioning the protocol rests on).
    - No automatic commits: progress is committed with the Kafka transaction that acted on it.
    - ``read_committed``: put-back copies and promotions are written in Kafka transactions.
    - ``auto.offset.reset`` ``error``: a read position below the log start (retention, a log cut
      back) is never jumped over silently; the session starts over and finds the gap.
    - Partition EOF events: a partition read to its end tells how far what it holds is known
      (the position alone cannot: it never passes a trailing commit marker; the relay's
      ``relay.op_frontier``).
    """
    return {
        "session.timeout.ms": 10000,
        "heartbeat.interval.ms": 1000,
        "topic.metadata.refresh.interval.ms": 10000,
        **(defaults or {}),
        **kafka,
        "group.id": group_id,
        "partition.assignment.strategy": "range",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        "auto.offset.reset": "error",
        "enable.partition.eof": True,
    }

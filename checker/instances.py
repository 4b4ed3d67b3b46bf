"""Live producer instances per group, from the compacted registry topic."""

from __future__ import annotations

import logging
import random
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from outbox.broker_clock import BrokerClock
from outbox.errors import ProtocolError
from outbox.kafka_logging import log_to_python
from outbox.protocol.registry import Registration, decode_registration

log = logging.getLogger("checker")


class LiveInstances:
    """Reads the registry topic from its start; an instance is live while its heartbeat is fresh:
    its broker stamp within ``ttl_s`` of ``clock``'s now, which these reads keep current."""

    def __init__(
        self,
        config: dict[str, Any],
        topic: str,
        ttl_s: float,
        *,
        clock: BrokerClock | None = None,
    ) -> None:
        self.ttl_ms = int(ttl_s * 1000)
        self.clock = clock or BrokerClock()
        self._seen: dict[bytes, tuple[Registration, int]] = {}
        self._consumer = Consumer(
            log_to_python(
                {**config, "group.id": "outbox-checker-registry", "enable.auto.commit": False}
            )
        )
        self._consumer.assign([TopicPartition(topic, 0, 0)])

    def poll(self) -> None:
        messages = self._consumer.consume(1000, 0)
        self.clock.read(messages)
        for msg in messages:
            key = msg.key()
            if msg.error() or key is None:
                continue
            try:
                reg = decode_registration(msg.value())
            except ProtocolError as err:
                log.warning("unreadable registry record %r: %s", key, err)
                continue
            if reg is None:
                self._seen.pop(key, None)
            else:
                self._seen[key] = (reg, msg.timestamp()[1])

    def live(self, group: str, now_ms: int | None = None) -> list[Registration]:
        now_ms = self.clock.now_ms() if now_ms is None else now_ms
        return [
            r
            for r, seen in self._seen.values()
            if r.group == group and now_ms - seen <= self.ttl_ms
        ]

    def pick(self, group: str, n: int) -> list[Registration]:
        """Up to ``n`` live instances in random order: the first is asked, the rest fail over."""
        live = self.live(group)
        random.shuffle(live)
        return live[:n]

    def close(self) -> None:
        self._consumer.close()

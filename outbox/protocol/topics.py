"""Names and settings of the internal topics, all derived from one prefix."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PREFIX = "__outbox"
#: How long an op record stays uncompacted: the window an audit can still see every decision.
DEFAULT_MIN_COMPACTION_LAG_MS = 7 * 24 * 3600 * 1000


@dataclass(frozen=True)
class TopicNames:
    """``{prefix}-half``, ``{prefix}-op``, ``{prefix}-registry``, ``{prefix}-dead-letter``."""

    prefix: str = DEFAULT_PREFIX

    @property
    def half(self) -> str:
        return f"{self.prefix}-half"

    @property
    def op(self) -> str:
        return f"{self.prefix}-op"

    @property
    def registry(self) -> str:
        return f"{self.prefix}-registry"

    @property
    def dead_letter(self) -> str:
        return f"{self.prefix}-dead-letter"

    def all(self) -> tuple[str, str, str, str]:
        return (self.half, self.op, self.registry, self.dead_letter)

    def is_internal(self, topic: str) -> bool:
        return topic.startswith(self.prefix)


def topic_settings(
    names: TopicNames, topic: str, *, min_compaction_lag_ms: int = DEFAULT_MIN_COMPACTION_LAG_MS
) -> dict[str, str]:
    """The topic-level configs each internal topic is created with.

    The half topic stamps records with the broker's clock (LogAppendTime), so check timing never
    depends on a producer's clock. The op and registry topics are compacted: the latest decision
    per transaction and the latest heartbeat per producer instance is what matters.
    """
    if topic == names.half:
        return {"cleanup.policy": "delete", "message.timestamp.type": "LogAppendTime"}
    if topic == names.op:
        return {
            "cleanup.policy": "compact",
            "min.compaction.lag.ms": str(min_compaction_lag_ms),
            "message.timestamp.type": "LogAppendTime",
        }
    if topic == names.registry:
        return {
            "cleanup.policy": "compact",
            "min.compaction.lag.ms": "0",
            "message.timestamp.type": "LogAppendTime",
        }
    if topic == names.dead_letter:
        return {"cleanup.policy": "delete", "retention.ms": "-1"}
    raise ValueError(f"{topic!r} is not an internal topic of prefix {names.prefix!r}")

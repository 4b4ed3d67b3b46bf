"""Names and settings of the internal topics, all derived from one prefix."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PREFIX = "__outbox"
_DAY_MS = 24 * 3600 * 1000
#: How long an op record stays uncompacted: the window an audit can still see every decision.
DEFAULT_MIN_COMPACTION_LAG_MS = 7 * _DAY_MS
#: How long half records are kept: Kafka's own default (``log.retention.hours=168``), written
#: on the topic so that the op topic's retention can be checked against it.
DEFAULT_HALF_RETENTION_MS = 7 * _DAY_MS
#: How long op records are kept. Twice the half records': Kafka deletes whole segments once
#: their newest record is older than ``retention.ms``, so a half record can live up to its
#: segment's roll time (``segment.ms``, 7 days by default) past its retention, and its
#: decision must outlive it.
DEFAULT_OP_RETENTION_MS = 14 * _DAY_MS
#: Kafka's ``retention.ms`` for "keep forever".
FOREVER = -1
#: The op topic's ``cleanup.policy``: compacted, and deleted by age (``retention.ms``).
OP_CLEANUP_POLICY = "compact,delete"


@dataclass(frozen=True)
class TopicNames:
    """``{prefix}-half``, ``{prefix}-op``, ``{prefix}-registry``, ``{prefix}-dead-letter``,
    ``{prefix}-state``."""

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

    @property
    def state(self) -> str:
        """What relays and checkers remember across restarts (:mod:`outbox.protocol.state`)."""
        return f"{self.prefix}-state"

    def all(self) -> tuple[str, str, str, str, str]:
        return (self.half, self.op, self.registry, self.dead_letter, self.state)

    def is_internal(self, topic: str) -> bool:
        return topic.startswith(self.prefix)


def topic_settings(
    names: TopicNames,
    topic: str,
    *,
    min_compaction_lag_ms: int = DEFAULT_MIN_COMPACTION_LAG_MS,
    half_retention_ms: int = DEFAULT_HALF_RETENTION_MS,
    op_retention_ms: int = DEFAULT_OP_RETENTION_MS,
) -> dict[str, str]:
    """The topic-level configs each internal topic is created with.

    The half topic stamps records with the broker's clock (LogAppendTime), so check timing never
    depends on a producer's clock. The op and registry topics are compacted: the latest decision
    per transaction and the latest heartbeat per producer instance is what matters. The op
    topic is deleted by age too: its keys are unique transaction ids, so compaction alone would
    keep every decision forever. Its retention outlasts the half records' (a decision is needed
    as long as its half records exist: the relay, the checker and the audit join them) and the
    compaction lag (the audit window). The state topic is compacted too: what a service
    remembers about each pending transaction.

    Raises:
        ValueError: ``topic`` is not one of ``names``, or ``op_retention_ms`` breaks
            :func:`op_retention_problem`.
    """
    if topic == names.half:
        return {
            "cleanup.policy": "delete",
            "retention.ms": str(half_retention_ms),
            "message.timestamp.type": "LogAppendTime",
        }
    if topic == names.op:
        problem = op_retention_problem(
            op_retention_ms,
            half_retention_ms=half_retention_ms,
            min_compaction_lag_ms=min_compaction_lag_ms,
        )
        if problem is not None:
            raise ValueError(problem)
        return {
            "cleanup.policy": OP_CLEANUP_POLICY,
            "retention.ms": str(op_retention_ms),
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
    if topic == names.state:
        # One live key per pending transaction a service remembers; a tombstone ends it. Small
        # segments let compaction drop the ended ones within the hour.
        return {"cleanup.policy": "compact", "segment.ms": "3600000"}
    raise ValueError(f"{topic!r} is not an internal topic of prefix {names.prefix!r}")


def op_retention_problem(
    op_retention_ms: int, *, half_retention_ms: int, min_compaction_lag_ms: int
) -> str | None:
    """Why op records kept ``op_retention_ms`` would go too soon, or None when they would not.

    They must outlast the half records (``half_retention_ms``): the relay and the checker read
    a transaction's op after its halves, and the audit joins the two. And the compaction lag
    (the audit window, ``min_compaction_lag_ms``): ops younger than it must all be there.
    ``-1`` keeps records forever.
    """
    if not _at_least(op_retention_ms, half_retention_ms):
        return (
            f"op retention.ms={op_retention_ms} is shorter than the half topic's retention.ms="
            f"{half_retention_ms}: decisions would go before the half records they decide"
        )
    if not _at_least(op_retention_ms, min_compaction_lag_ms):
        return (
            f"op retention.ms={op_retention_ms} is shorter than its min.compaction.lag.ms="
            f"{min_compaction_lag_ms} (the audit window): the audit would miss decisions"
        )
    return None


def required_op_retention_ms(*bounds: int) -> int:
    """The shortest op retention at least each of ``bounds`` (``-1``: forever)."""
    return FOREVER if FOREVER in bounds else max(bounds)


def _at_least(retention_ms: int, bound: int) -> bool:
    return retention_ms == FOREVER or (bound != FOREVER and retention_ms >= bound)

"""Going on past op records that retention removed before the relay read them.

The op topic is deleted by age (``cleanup.policy=compact,delete``, ``retention.ms``, 14 days by
default): its keys are unique transaction ids, so compaction alone would keep every decision
forever. A relay down for longer than that comes back to a committed op offset below the op
partition's log start. The consumer cannot read from there (``auto.offset.reset=error``:
jumping silently is never right), and starting each new session from the same committed offset
would fail the same way for good. So the rebuild starts such a partition at its log start,
with an error naming the removed offsets.

Nothing is promoted that was not decided: the relay never handled the removed ops (its progress
is committed with what it promoted), so none of their transactions was promoted. Those whose
half records are still there stay pending, and the checker decides them again. The op topic's
retention outlasting the half topic's (``ensure_topics`` checks it) makes those few: by the
time a decision goes, its half records have mostly gone before it.
"""

from __future__ import annotations

import dataclasses
import logging

from confluent_kafka import Consumer, TopicPartition

from outbox.logs import fields
from relay.progress import Progress
from relay.rebalance import Rebuild
from relay.state import PartitionState

log = logging.getLogger("relay")


def from_op_log_start(op_topic: str, rebuild: Rebuild) -> Rebuild:
    """``rebuild``, for partitions whose committed op offset retention passed: from the op
    partition's log start instead, each logged as an error."""

    def rebuild_past_removed_ops(
        consumer: Consumer, progress: dict[int, Progress]
    ) -> dict[int, PartitionState]:
        return rebuild(
            consumer, {p: past_removed_ops(consumer, op_topic, p, at) for p, at in progress.items()}
        )

    return rebuild_past_removed_ops


def past_removed_ops(consumer: Consumer, op_topic: str, partition: int, at: Progress) -> Progress:
    """``at``, or ``at`` moved to the op partition's log start if retention removed ops the
    relay had not read (the relay was down for longer than the op topic's ``retention.ms``)."""
    low, _ = consumer.get_watermark_offsets(
        TopicPartition(op_topic, partition), timeout=10, cached=False
    )
    if at.op_offset >= low:
        return at
    log.error(
        "%s[%d]: ops at offsets %d..%d were removed by retention before the relay read them "
        "(it was stopped for longer than the op topic's retention.ms); going on from %d. The "
        "transactions they decided that still have half records stay pending until the "
        "checker decides them again; none of them was promoted",
        op_topic,
        partition,
        at.op_offset,
        low - 1,
        low,
        extra=fields(topic=op_topic, partition=partition),
    )
    return dataclasses.replace(at, op_offset=int(low), rebuild_from=max(at.rebuild_from, int(low)))

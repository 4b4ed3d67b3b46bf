"""What one checker round writes, and what it counts once that is written."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from outbox.logs import fields as log_fields
from outbox.protocol.half import HalfRecord
from outbox.protocol.op import OpRecord
from outbox.protocol.state import CheckCount
from outbox.protocol.states import OpState

if TYPE_CHECKING:
    from opentelemetry.trace import Span

log = logging.getLogger("checker")


@dataclass
class CheckerStats:
    checks: int = 0
    resolved_commit: int = 0
    resolved_rollback: int = 0
    unknown: int = 0
    given_up: int = 0
    incomplete: int = 0
    unreachable: int = 0
    breaker_trips: int = 0
    write_failures: int = 0
    orphans: int = 0
    held: int = 0

    def add(self, other: CheckerStats) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass
class RoundPlan:
    """Records for one Kafka transaction, and the counters it adds when it commits."""

    ops: list[OpRecord] = field(default_factory=list)
    letters: list[tuple[HalfRecord, str]] = field(default_factory=list)
    #: (partition, transaction id, its check count or None for a tombstone)
    states: list[tuple[int, str, CheckCount | None]] = field(default_factory=list)
    counted: CheckerStats = field(default_factory=CheckerStats)
    #: The spans of its decisions (:mod:`checker.tracing`), ended once it is written.
    spans: list[Span] = field(default_factory=list)

    def decision(self, op: OpRecord, *, incomplete: bool = False) -> None:
        self.ops.append(op)
        if op.state is OpState.COMMIT:
            self.counted.resolved_commit += 1
        elif op.state is OpState.ROLLBACK:
            self.counted.resolved_rollback += 1
        else:
            self.counted.given_up += 1
            self.counted.incomplete += incomplete

    def log_written(self) -> None:
        """Say each COMMIT and ROLLBACK the round wrote, with the half offsets it names (giving
        up is logged with its reason when decided). Once written: a round whose Kafka
        transaction failed says nothing it did not do."""
        for op in self.ops:
            if op.state is OpState.GIVEN_UP:
                continue
            log.info(
                "decided %s for transaction %s of group %s: half partition %d, offsets %s",
                op.state.value,
                op.txn_id,
                op.producer_group,
                op.half_partition,
                list(op.half_offsets),
                extra=log_fields(
                    txn_id=op.txn_id,
                    group=op.producer_group,
                    partition=op.half_partition,
                    offsets=list(op.half_offsets),
                ),
            )

    def __bool__(self) -> bool:
        return bool(self.ops or self.letters or self.states)

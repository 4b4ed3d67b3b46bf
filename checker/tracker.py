"""Which transactions are undecided and when each is due for a check. Pure logic, no I/O.

Time is the broker's (the half topic's LogAppendTime) against the checker's own clock, never the
producer's: a producer whose clock is off is checked neither early nor late.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from outbox.protocol.half import HalfRecord
from outbox.protocol.states import OpState


@dataclass
class Pending:
    """An undecided transaction. Records are keyed by message index: a put-back copy replaces
    nothing and adds nothing, and ops name the original offsets."""

    txn_id: str
    group: str
    partition: int
    records: dict[int, HalfRecord] = field(default_factory=dict)
    first_ms: int = 0
    due_ms: int = 0
    checks: int = 0
    unreachable_since_ms: int | None = None
    #: Set when resumed with no record in hand: where the resumed copies are, to fetch them
    #: (once: emptied by the fetch).
    resumed_offsets: tuple[int, ...] = ()
    #: Message indices whose dead-letter copy the broker took: a give-up repeated because its
    #: GIVEN_UP op was not written does not copy them again.
    dead_lettered: set[int] = field(default_factory=set)

    @property
    def offsets(self) -> list[int]:
        """The original offsets of its half records, in message-index order."""
        return [self.records[i].original_offset for i in sorted(self.records)]


@dataclass
class Tracker:
    """Undecided transactions of the partitions one checker instance owns."""

    timeout_ms: int
    interval_ms: int
    pending: dict[str, Pending] = field(default_factory=dict)
    decided: dict[str, OpState] = field(default_factory=dict)
    duplicates: int = 0
    conflicts: int = 0

    def add_half(self, record: HalfRecord) -> None:
        if record.txn_id in self.decided:
            return
        entry = self.pending.get(record.txn_id)
        if entry is None:
            immunity_ms = (record.check_immunity_s or 0) * 1000
            entry = Pending(record.txn_id, record.producer_group, record.partition)
            entry.first_ms = record.timestamp_ms
            entry.due_ms = record.timestamp_ms + max(self.timeout_ms, immunity_ms)
            self.pending[record.txn_id] = entry
        entry.records.setdefault(record.index, record)

    def resume(
        self, txn_id: str, group: str, partition: int, offsets: tuple[int, ...], at_ms: int
    ) -> None:
        """A given-up transaction was put back to be checked: undecided again, checks from 0,
        first check a timeout after the RESUMED op (broker time)."""
        self.decided.pop(txn_id, None)
        if txn_id in self.pending:
            return
        entry = Pending(txn_id, group, partition, first_ms=at_ms, resumed_offsets=offsets)
        entry.due_ms = at_ms + self.timeout_ms
        self.pending[txn_id] = entry

    def decide(self, txn_id: str, state: OpState) -> Pending | None:
        """An op was read: the transaction is no longer undecided. The first terminal op wins;
        a later one is counted, as a duplicate or, when its state differs, as a conflict."""
        first = self.decided.get(txn_id)
        if first is None:
            self.decided[txn_id] = state
        elif first is state:
            self.duplicates += 1
        else:
            self.conflicts += 1
        return self.pending.pop(txn_id, None)

    def undecide(self, entry: Pending, due_ms: int) -> None:
        """This checker's decision was not written: undecided again, due at ``due_ms``, its
        checks kept (a GIVEN_UP one is given up again at its next UNKNOWN)."""
        self.decided.pop(entry.txn_id, None)
        entry.due_ms = due_ms
        self.pending.setdefault(entry.txn_id, entry)

    def due(self, now_ms: int) -> list[Pending]:
        return sorted(
            (p for p in self.pending.values() if p.due_ms <= now_ms), key=lambda p: p.due_ms
        )

    def unknown(self, entry: Pending, now_ms: int) -> None:
        """A producer answered UNKNOWN: count it and check again after the interval."""
        entry.checks += 1
        entry.unreachable_since_ms = None
        entry.due_ms = now_ms + self.interval_ms

    def unreachable(self, entry: Pending, now_ms: int) -> int:
        """No producer answered: not counted as a check. Returns how long (ms) it has lasted."""
        if entry.unreachable_since_ms is None:
            entry.unreachable_since_ms = now_ms
        entry.due_ms = now_ms + min(self.interval_ms, 5_000)
        return now_ms - entry.unreachable_since_ms

    def drop_partition(self, partition: int) -> None:
        for txn_id in [t for t, p in self.pending.items() if p.partition == partition]:
            del self.pending[txn_id]

    def min_offset(self, partition: int) -> int | None:
        offsets = [
            r.offset
            for p in self.pending.values()
            if p.partition == partition
            for r in p.records.values()
        ]
        return min(offsets) if offsets else None

"""Which transactions are undecided, when each is due for a check, and the decisions that still
matter. Pure logic, no I/O.

Time is the broker's (the half topic's LogAppendTime) against the checker's own clock, never the
producer's: a producer whose clock is off is checked neither early nor late.

Memory is bounded by the undecided transactions, not by history:

- a pending entry is made from a transaction's *original* half records (or a RESUMED op):
  a put-back copy of a transaction not pending here is a copy of one decided before this
  checker's committed position (which never passes a pending original), so it is ignored -
  unless its original lay at or past that position and below the first record this session
  read: retention removed it unread (the checker was down longer than the half topic's
  retention, or its group is new), and the copy is all that is left of an undecided
  transaction (:meth:`Tracker.reading_from`);
- a decision is remembered only while a half record it settles can still be read: its op's
  broker time is not older than the partition's *floor* (the first record of its oldest pending
  transaction, or the last half record read when none is pending) by more than ``slack_ms``.
  An op is appended after its transaction's halves, so a half read later is settled by an op
  at least as young as it (:meth:`Tracker.prune`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from outbox.protocol.half import HalfRecord
from outbox.protocol.state import CheckCount
from outbox.protocol.states import CheckBy, OpState


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
    #: Made pending from put-back copies whose originals retention removed unread.
    orphaned: bool = False
    #: An orphaned one was reported (logged and counted) when first asked about.
    reported: bool = False

    @property
    def offsets(self) -> list[int]:
        """The original offsets of its half records, in message-index order."""
        return [self.records[i].original_offset for i in sorted(self.records)]

    @property
    def first_offset(self) -> int | None:
        """The lowest offset a restart must read from to find it again. For an orphaned one,
        its originals' (gone): committed, it tells the next session that copies of originals
        from there on are to be taken up again (:meth:`Tracker.reading_from`)."""
        found = [r.offset for r in self.records.values()] + list(self.resumed_offsets)
        if self.orphaned:
            found += [r.original_offset for r in self.records.values()]
        return min(found) if found else None

    @property
    def check_by(self) -> str:
        return next(iter(self.records.values())).check_by if self.records else CheckBy.EVIDENCE

    def count(self) -> CheckCount:
        return CheckCount(self.checks, self.unreachable_since_ms)


@dataclass
class Decided:
    state: OpState
    partition: int
    #: The op's broker timestamp: the decision is forgotten once it is older than the floor.
    ts_ms: int


@dataclass
class Tracker:
    """Undecided transactions of the partitions one checker instance owns."""

    timeout_ms: int
    interval_ms: int
    slack_ms: int = 10_000
    pending: dict[str, Pending] = field(default_factory=dict)
    decided: dict[str, Decided] = field(default_factory=dict)
    #: Check counts read back from the state topic, for transactions whose halves come next:
    #: txn id -> (partition, count).
    restored: dict[str, tuple[int, CheckCount]] = field(default_factory=dict)
    #: Broker time of the last half record read, per partition (the floor when none pends).
    last_half_ms: dict[int, int] = field(default_factory=dict)
    #: Per partition, the committed half offset this session started from (0: none).
    committed_half: dict[int, int] = field(default_factory=dict)
    #: Per partition, the first half record this session read: (offset, broker time).
    first_read: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: Partitions not yet read to their end since assigned. Those whose first half record read
    #: lay past the committed offset (retention removed what was between) hold the committed
    #: position back meanwhile (:meth:`_holding`).
    catching_up: set[int] = field(default_factory=set)
    #: Decisions this checker wrote, not read back from the op topic yet: txn id -> (state,
    #: partition). Dropped with their partition (:meth:`drop_partition`): read back after the
    #: partition came back, such an op decides the transaction read again meanwhile.
    written: dict[str, tuple[OpState, int]] = field(default_factory=dict)
    duplicates: int = 0
    conflicts: int = 0

    def reading_from(self, partition: int, committed_half: int) -> None:
        """The session starts reading ``partition`` at its committed half offset (negative:
        none). A copy read later whose original lies at or past that offset, yet below the
        first record read, names an original this checker never read and never will:
        retention removed it. Such a copy is taken up as pending, not ignored (nothing else
        would ever decide its transaction). Below the committed offset, an original was read
        by an earlier session, which never commits past a pending one: decided, so ignored.
        A session whose committed offset is still in the log reads every original it names."""
        self.committed_half[partition] = max(committed_half, 0)
        self.first_read.pop(partition, None)
        self.catching_up.add(partition)

    def read_to_end(self, partition: int) -> None:
        """The session read ``partition``'s half records to the end it had when assigned: every
        copy of an original it never read has been seen (:meth:`half_floor`)."""
        self.catching_up.discard(partition)

    def add_half(self, record: HalfRecord) -> None:
        self.last_half_ms[record.partition] = max(
            self.last_half_ms.get(record.partition, 0), record.timestamp_ms
        )
        first = self.first_read.get(record.partition)
        if first is None:  # (a tuple made once per partition, not per record)
            first = self.first_read[record.partition] = (record.offset, record.timestamp_ms)
        if record.txn_id in self.decided:
            return
        entry = self.pending.get(record.txn_id)
        if entry is None:
            orphaned = record.is_copy and self._original_gone(record, first[0])
            if record.is_copy and not orphaned:
                return  # a copy of a transaction decided before this checker's position
            immunity_ms = (record.check_immunity_s or 0) * 1000
            entry = Pending(record.txn_id, record.producer_group, record.partition)
            entry.first_ms = record.timestamp_ms
            if orphaned:
                # Its own first record is older than anything still readable: from the first
                # record read on, every decision a copy read later may need is re-read.
                entry.first_ms = min(first[1], record.timestamp_ms)
            entry.due_ms = entry.first_ms + max(self.timeout_ms, immunity_ms)
            entry.orphaned = orphaned
            found = self.restored.pop(record.txn_id, None)
            if found is not None:
                count = found[1]
                entry.checks, entry.unreachable_since_ms = count.checks, count.unreachable_since_ms
            self.pending[record.txn_id] = entry
        entry.records.setdefault(record.index, record)

    def resume(
        self, txn_id: str, group: str, partition: int, offsets: tuple[int, ...], at_ms: int
    ) -> None:
        """A given-up transaction was put back to be checked: undecided again, checks from 0,
        first check a timeout after the RESUMED op (broker time)."""
        self.decided.pop(txn_id, None)
        self.restored.pop(txn_id, None)
        if txn_id in self.pending:
            return
        entry = Pending(txn_id, group, partition, first_ms=at_ms, resumed_offsets=offsets)
        entry.due_ms = at_ms + self.timeout_ms
        self.pending[txn_id] = entry

    def wrote(self, txn_id: str, state: OpState, partition: int, ts_ms: int) -> Pending | None:
        """This checker decided: the transaction is no longer undecided, and its op, once read
        back, is no duplicate (:meth:`decide`)."""
        self.written.pop(txn_id, None)  # (an older write is no reason not to decide)
        entry = self.decide(txn_id, state, partition, ts_ms)
        self.written[txn_id] = (state, partition)
        return entry

    def decide(self, txn_id: str, state: OpState, partition: int, ts_ms: int) -> Pending | None:
        """An op was read: the transaction is no longer undecided. The first terminal op wins;
        a later one is counted, as a duplicate or, when its state differs, as a conflict - but
        for this checker's own decision read back (:meth:`wrote`)."""
        own = self.written.pop(txn_id, None)
        if own is not None and own[0] is state:
            return None
        first = self.decided.get(txn_id)
        if first is None:
            self.decided[txn_id] = Decided(state, partition, ts_ms)
        elif first.state is state:
            self.duplicates += 1
        else:
            self.conflicts += 1
        self.restored.pop(txn_id, None)
        return self.pending.pop(txn_id, None)

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

    def hold(self, entry: Pending, now_ms: int) -> None:
        """Which producer instances are live is not known (the registry unread): due again
        shortly, no check counted, no unreachable time started."""
        entry.due_ms = now_ms + min(self.interval_ms, 5_000)

    def later(self, entry: Pending, now_ms: int) -> None:
        """Not decided this time for a reason of the checker's own: due again after the
        interval, no check counted."""
        entry.due_ms = now_ms + self.interval_ms

    def drop_partition(self, partition: int) -> None:
        for txn_id in [t for t, p in self.pending.items() if p.partition == partition]:
            del self.pending[txn_id]
        for txn_id in [t for t, d in self.decided.items() if d.partition == partition]:
            del self.decided[txn_id]
        for txn_id in [t for t, (p, _) in self.restored.items() if p == partition]:
            del self.restored[txn_id]
        for txn_id in [t for t, (_, p) in self.written.items() if p == partition]:
            del self.written[txn_id]
        self.last_half_ms.pop(partition, None)
        self.committed_half.pop(partition, None)
        self.first_read.pop(partition, None)
        self.catching_up.discard(partition)

    def _original_gone(self, copy: HalfRecord, first_read: int) -> bool:
        since = self.committed_half.get(copy.partition)
        return since is not None and since <= copy.original_offset < first_read

    def stale_counts(self, partition: int) -> list[str]:
        """Counts read back for transactions the partition, read to its end, does not hold
        pending (decided meanwhile by an op this checker did not re-read): forgotten here, and
        to be tombstoned by the caller."""
        stale = [t for t, (p, _) in self.restored.items() if p == partition]
        for txn_id in stale:
            del self.restored[txn_id]
        return stale

    # -- bounds ----------------------------------------------------------------------------

    def half_floor(self, partition: int, read_position: int) -> int:
        """The half offset a restart must read from: never past a pending transaction's first
        record (original, or a resumed copy not yet fetched), nor past the committed offset
        while the partition is :attr:`catching_up` - copies still to be read may name originals
        retention removed, which a restart recognises only from that offset."""
        firsts = [
            first
            for p in self.pending.values()
            if p.partition == partition and (first := p.first_offset) is not None
        ]
        held = self._holding(partition)
        return min([*firsts, read_position, *([] if held is None else [held[0]])])

    def floor_ms(self, partition: int, *, restart: bool = True) -> int | None:
        """Broker time from which a restart must re-read decisions (before ``slack_ms``): while
        catching up, no later than the first record read (a restart reads copies from there
        on, of transactions decided since). Without ``restart``: the floor for this session's
        own reading, which goes on from the last record read (:meth:`prune`)."""
        firsts = [p.first_ms for p in self.pending.values() if p.partition == partition]
        held = self._holding(partition) if restart else None
        if held is not None and held[1] is not None:
            firsts.append(held[1])
        if firsts:
            return min(firsts)
        return self.last_half_ms.get(partition)

    def _holding(self, partition: int) -> tuple[int, int | None] | None:
        """(committed offset, first record's broker time) while ``partition`` is catching up
        past a gap retention left; None otherwise."""
        if partition not in self.catching_up:
            return None
        since = self.committed_half[partition]
        first = self.first_read.get(partition)
        if first is None:
            return (since, None)
        return (since, first[1]) if first[0] > since else None

    def prune(self) -> int:
        """Forget decisions no half record still to be read can need; returns how many."""
        floors: dict[int, int | None] = {}
        gone = []
        for txn_id, decided in self.decided.items():
            if decided.partition not in floors:
                floors[decided.partition] = self.floor_ms(decided.partition, restart=False)
            floor = floors[decided.partition]
            if floor is not None and decided.ts_ms < floor - self.slack_ms:
                gone.append(txn_id)
        for txn_id in gone:
            del self.decided[txn_id]
        return len(gone)

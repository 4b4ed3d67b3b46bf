"""What one relay knows about one partition pair (half partition p, op partition p).

Pure logic, no Kafka. Records go in; :meth:`PartitionState.take` hands out what to write in the
next Kafka transaction (promotions, put-backs, dead letters) and the progress to commit with it.
If that Kafka transaction fails, the state is thrown away and rebuilt from the committed progress
(:func:`relay.rebuild.rebuild`), so nothing here has to be undone.

Invariants the rest of the relay relies on:

* Terminal ops are handled in op-offset order, each once (its offset is committed in the same
  Kafka transaction as its promotion), so transactions on one key reach their real topic in the
  order of their COMMIT ops.
* An op is handled only after the half reader has passed every half record it names, and never
  while put-back copies of its transaction are still on their way back. So a transaction decided
  before the committed op offset never has a half record at or after the committed half offset
  that the rebuild could mistake for pending, unless its op lies at or after ``rebuild_from``.
* The committed half offset never passes a record of a pending transaction; long-pending ones are
  put back (re-appended) so it keeps moving.
"""

from __future__ import annotations

import json
import sys
from collections import OrderedDict, deque
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass, field

from outbox.protocol.half import HalfRecord
from outbox.protocol.op import OpRecord
from outbox.protocol.states import TERMINAL_STATES, OpState

#: Progress metadata format version (stored with the committed op offset).
PROGRESS_VERSION = 1


@dataclass(slots=True)
class Entry:
    """An undecided transaction: where its half records are, and them while they are held."""

    txn_id: str
    group: str
    #: Op position when its oldest current record was read (bounds the rebuild scan).
    op_pos: int
    #: Message index -> (current offset, broker timestamp), for every record, held or not.
    where: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: Message index -> record, while held; emptied when evicted to stay under the memory cap
    #: (the records are then read back by offset when needed).
    records: dict[int, HalfRecord] = field(default_factory=dict)
    evicted: bool = False

    @property
    def first_offset(self) -> int:
        return min(offset for offset, _ in self.where.values())

    @property
    def first_ts_ms(self) -> int:
        return min(ts for _, ts in self.where.values())

    def offsets(self) -> tuple[int, ...]:
        return tuple(self.where[i][0] for i in sorted(self.where))


@dataclass(frozen=True)
class Promote:
    """Write these records (message-index order) to their real topics."""

    op: OpRecord
    records: tuple[HalfRecord, ...]


@dataclass(frozen=True)
class Drop:
    """Rolled back or given up: never delivered."""

    op: OpRecord


@dataclass(frozen=True)
class PutBack:
    """Re-append these records (copies) to the half partition."""

    records: tuple[HalfRecord, ...]


@dataclass(frozen=True)
class Reject:
    """An op that cannot be carried out (its half records are gone or never existed)."""

    op: OpRecord
    reason: str


@dataclass(frozen=True)
class BadRecord:
    """An internal-topic record that cannot be decoded: dead-lettered whole."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    reason: str


Action = Promote | Drop | PutBack | Reject | BadRecord


@dataclass(frozen=True)
class Need:
    """``take`` cannot go on until the records of ``txn_id`` at ``offsets`` are supplied."""

    txn_id: str
    offsets: tuple[int, ...]


@dataclass(frozen=True)
class Batch:
    """What one Kafka transaction writes for this partition, and the progress it commits."""

    actions: list[Action]
    half_offset: int
    op_offset: int
    metadata: str


@dataclass
class Counters:
    promoted: int = 0
    dropped: int = 0
    rejected: int = 0
    put_back: int = 0
    duplicates: int = 0
    conflicts: int = 0
    bad_records: int = 0
    evicted: int = 0


@dataclass
class Progress:
    """Committed progress of one partition pair (what :func:`rebuild` starts from)."""

    half_offset: int = 0
    op_offset: int = 0
    rebuild_from: int = 0
    parked: tuple[str, ...] = ()

    def metadata(self) -> str:
        return json.dumps(
            {"v": PROGRESS_VERSION, "l": self.rebuild_from, "parked": list(self.parked)},
            separators=(",", ":"),
        )

    @classmethod
    def parse(cls, half_offset: int, op_offset: int, metadata: str | None) -> Progress:
        """Progress as committed; no or foreign metadata means "scan from the op offset"."""
        try:
            doc = json.loads(metadata or "")
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or doc.get("v") != PROGRESS_VERSION:
            return cls(half_offset, op_offset, op_offset)
        return cls(half_offset, op_offset, int(doc["l"]), tuple(doc.get("parked", ())))


#: Decides whether a transaction's records can be written now (their topics exist, nothing
#: refused them lately). Returns None when they can, else the reason they wait.
Promotable = Callable[[OpRecord, tuple[HalfRecord, ...]], str | None]


def _always(op: OpRecord, records: tuple[HalfRecord, ...]) -> str | None:
    return None


_NOT_FOUND = "its half records were not found (retention?)"


def _part_of(records: tuple[HalfRecord, ...]) -> str | None:
    """Why promoting ``records``, the ones a COMMIT names, would deliver part of a transaction
    or nothing (None: it would deliver all of it). The records are the op's indexes 0..n-1
    (``_records``), so only their message count can say more are missing; once per promotion."""
    if not records:
        return "names no half record, so it would deliver nothing"
    n = len(records)
    for record in records:
        if record.count is not None and record.count != n:
            return (
                f"names {n} half record(s), but message {record.index} carries a message "
                f"count of {record.count}; promoting them would deliver part of the "
                "transaction: re-send its messages from their source"
            )
    return None


@dataclass
class PartitionState:
    """State of partition number ``partition`` of the half and op topics."""

    partition: int
    half_position: int = 0
    op_position: int = 0
    max_held_records: int = 10_000
    decided_memory: int = 200_000
    pending: dict[str, Entry] = field(default_factory=dict)
    decided: OrderedDict[str, OpState] = field(default_factory=OrderedDict)
    queue: deque[tuple[int, OpRecord | None]] = field(default_factory=deque)
    #: Put back, copies not read back yet: txn id -> (op position at put-back, copies left).
    in_flight: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: COMMITs handled but not written yet (topic missing or refused): txn id -> op.
    parked: dict[str, OpRecord] = field(default_factory=dict)
    #: (op offset, half end then) of decisions whose copies may lie ahead of the reader.
    ahead: deque[tuple[int, int]] = field(default_factory=deque)
    fetched: dict[str, dict[int, HalfRecord] | None] = field(default_factory=dict)
    #: Actions decided since the last batch was handed out.
    out: list[Action] = field(default_factory=list)
    #: Pending transactions whose records may still be held, in read order: the eviction
    #: candidates (stale ids are skipped), so evicting never rescans evicted entries.
    unevicted: deque[str] = field(default_factory=deque)
    held: int = 0
    counters: Counters = field(default_factory=Counters)
    _log_end: int = 0

    # -- input -------------------------------------------------------------------------------

    def add_half(self, record: HalfRecord) -> None:
        self.half_position = max(self.half_position, record.offset + 1)
        txn = record.txn_id
        if txn in self.in_flight:
            pos, left = self.in_flight[txn]
            if left <= 1:
                del self.in_flight[txn]
            else:
                self.in_flight[txn] = (pos, left - 1)
        if txn in self.decided:
            return  # handled before (a re-read after a restart, or a copy of a decided one)
        entry = self.pending.get(txn)
        if entry is None:
            entry = Entry(txn, sys.intern(record.producer_group), op_pos=self._floor())
            self.pending[txn] = entry
            self._candidate(txn)
        old = entry.where.get(record.index)
        if old is None or record.offset > old[0]:  # a newer copy replaces what was read
            entry.where[record.index] = (record.offset, record.timestamp_ms)
            if not entry.evicted:
                self.held += record.index not in entry.records
                entry.records[record.index] = record
        self._evict()

    def add_op(self, offset: int, op: OpRecord | None) -> None:
        """Queue an op in partition order; None for a tombstone or an undecodable one."""
        self.queue.append((offset, op))

    def add_bad(self, bad: BadRecord, *, half: bool) -> None:
        """An undecodable record: dead-lettered with the next batch, its offset passed."""
        self.out.append(bad)
        self.counters.bad_records += 1
        if half:
            self.half_position = max(self.half_position, bad.offset + 1)
        else:
            self.add_op(bad.offset, None)

    def supply(self, txn_id: str, records: Iterable[HalfRecord] | None) -> None:
        """Answer a :class:`Need`: the records found at its offsets (None: not found)."""
        self.fetched[txn_id] = None if records is None else {r.index: r for r in records}

    # -- output ------------------------------------------------------------------------------

    def take(
        self,
        now_ms: int,
        *,
        put_back_after_ms: int,
        log_end: int = 0,
        verified_end: int | None = None,
        promotable: Promotable = _always,
        max_put_back: int = 1000,
        unmovable: Container[str] = frozenset(),
    ) -> Batch | Need:
        """Everything that can be done now, or the records needed before going on.

        After a :class:`Need`, :meth:`supply` the records and call again: what was decided so
        far is kept. ``log_end`` is the half partition's end offset as last seen;
        ``verified_end`` is one just read from the broker, when the relay had reason to ask: an
        op naming records at or past it can never be carried out (producers write their half
        records before their op). Transactions in ``unmovable`` are never put back (their
        copies were refused): they stay pending where they are.
        """
        self._log_end = max(log_end, self.half_position)
        need = self._handle_ops(verified_end, promotable)
        if need is None:
            need = self._retry_parked(promotable)
        if need is None:
            need = self._put_back(now_ms - put_back_after_ms, max_put_back, unmovable)
        if need is not None:
            return need
        actions, self.out = self.out, []
        self.fetched.clear()
        while self.ahead and self.half_position >= self.ahead[0][1]:
            self.ahead.popleft()
        progress = self.progress()
        return Batch(actions, progress.half_offset, progress.op_offset, progress.metadata())

    @property
    def op_read_position(self) -> int:
        """The next op offset to read (ops read but not handled yet wait in the queue)."""
        return self.queue[-1][0] + 1 if self.queue else self.op_position

    def waiting_op(self) -> OpRecord | None:
        """The op at the head of the queue when it waits for half records, else None."""
        return self.queue[0][1] if self.queue else None

    def progress(self) -> Progress:
        pending_offsets = [e.first_offset for e in self.pending.values()]
        half = min([*pending_offsets, self.half_position])
        rebuild_from = min(
            [
                self.op_position,
                *(e.op_pos for e in self.pending.values()),
                # not needed by the invariant (a transaction in flight is undecided), kept as
                # a margin: it only delays the rebuild point while copies travel
                *(pos for pos, _ in self.in_flight.values()),
                *(op.offset for op in self.parked.values()),
                *(offset for offset, _ in self.ahead),
            ]
        )
        return Progress(half, self.op_position, rebuild_from, tuple(self.parked))

    # -- ops ---------------------------------------------------------------------------------

    def _handle_ops(self, verified_end: int | None, promotable: Promotable) -> Need | None:
        while self.queue:
            offset, op = self.queue[0]
            if op is not None:
                outcome = self._handle(op, verified_end, promotable)
                if isinstance(outcome, Need):
                    return outcome
                if outcome is False:
                    return None  # waits for its half records; later ops wait behind it
            self.queue.popleft()
            self.op_position = offset + 1
        return None

    def _handle(
        self, op: OpRecord, verified_end: int | None, promotable: Promotable
    ) -> bool | Need:
        """True: handled. False: must wait. Need: records to fetch first."""
        txn = op.txn_id
        if op.state is OpState.RESUMED:
            return self._resume(op)
        if txn in self.decided or txn in self.parked:
            first = self.decided.get(txn, OpState.COMMIT)
            if first is op.state:
                self.counters.duplicates += 1
            else:
                self.counters.conflicts += 1
            return True
        last = max(op.half_offsets, default=-1)
        if verified_end is not None and last >= verified_end:
            return self._reject(
                op, f"names half offset {last}, past the end ({verified_end}) of the partition"
            )
        if self.half_position <= last or txn in self.in_flight:
            return False
        entry = self.pending.get(txn)
        if op.state is not OpState.COMMIT:
            self.out.append(Drop(op))
            self.counters.dropped += 1
            self._decided(op, entry)
            return True
        records = self._records(op, entry)
        if isinstance(records, Need):
            return records
        if records is None:
            return self._reject(op, _NOT_FOUND)
        why = _part_of(records)
        if why is not None:
            return self._reject(op, why)
        if promotable(op, records) is not None:
            self.parked[txn] = op
            if entry is None:
                self._hold(txn, op.producer_group, records, op_pos=op.offset)
            return True
        self.out.append(Promote(op, records))
        self.counters.promoted += 1
        self._decided(op, entry)
        return True

    def _records(self, op: OpRecord, entry: Entry | None) -> tuple[HalfRecord, ...] | Need | None:
        """The op's records with their values, from memory or a fetch; None if not found."""
        count = op.message_count
        if not count:
            return ()  # nothing to look for: _part_of() refuses it
        complete = entry is not None and all(i in entry.where for i in range(count))
        if entry is not None and complete and not entry.evicted:
            return tuple(entry.records[i] for i in range(count))
        if op.txn_id in self.fetched:
            found = self.fetched[op.txn_id]
            if found is None or any(i not in found for i in range(count)):
                return None
            return tuple(found[i] for i in range(count))
        if entry is not None and complete:
            return Need(op.txn_id, tuple(entry.where[i][0] for i in range(count)))
        return Need(op.txn_id, op.half_offsets)

    def _decided(self, op: OpRecord, entry: Entry | None) -> None:
        self._remember(op.txn_id, op.state)
        self._forget(op.txn_id)
        self._bound(op.offset)

    def _floor(self) -> int:
        """The op offset a rebuild would have to start from if the state were rebuilt now.

        A record read while an earlier bound is still open (the reader has not reached the
        end it names) may have been read, in an earlier life of this state, when decisions
        from that bound on were not yet made; it inherits the bound.
        """
        return min(self.op_position, self.ahead[0][0]) if self.ahead else self.op_position

    def _bound(self, op_offset: int) -> None:
        """A transaction was decided; copies of it may still lie ahead of the reader (a restart
        forgets which were put back), up to the half partition's end as known now. Until the
        reader passes that end, the rebuild must re-learn decisions from this op on."""
        if self.half_position >= self._log_end:
            return
        if self.ahead and self.ahead[-1][1] >= self._log_end:
            return  # an earlier op bounds it already, for at least as long
        self.ahead.append((op_offset, self._log_end))

    def _hold(self, txn_id: str, group: str, records: Iterable[HalfRecord], *, op_pos: int) -> None:
        entry = Entry(txn_id, group, op_pos=min(op_pos, self._floor()))
        for record in records:
            entry.where[record.index] = (record.offset, record.timestamp_ms)
            entry.records[record.index] = record
        self.pending[txn_id] = entry
        self._candidate(txn_id)
        self.held += len(entry.records)
        self._evict()

    def _reject(self, op: OpRecord, reason: str) -> bool:
        self.out.append(Reject(op, reason))
        self.counters.rejected += 1
        self._decided(op, self.pending.get(op.txn_id))
        return True

    def _resume(self, op: OpRecord) -> bool | Need:
        """A given-up transaction put back to be checked: undecided again, its copies pending."""
        txn = op.txn_id
        self.decided.pop(txn, None)
        if txn in self.pending:
            return True
        if op.txn_id not in self.fetched:
            if self.half_position <= max(op.half_offsets, default=-1):
                return True  # the reader has not reached the copies: it will find them
            return Need(txn, op.half_offsets)
        found = self.fetched[txn]
        if found:
            self._hold(txn, op.producer_group, found.values(), op_pos=op.offset)
        return True

    def _retry_parked(self, promotable: Promotable) -> Need | None:
        for txn, op in list(self.parked.items()):
            if txn in self.in_flight:
                continue  # put back meanwhile: retried once its copies are read back
            entry = self.pending.get(txn)
            records = self._records(op, entry)
            if isinstance(records, Need):
                return records
            why = _NOT_FOUND if records is None else _part_of(records)
            if records is None or why is not None:  # (_part_of: parked by an older relay)
                del self.parked[txn]
                self.out.append(Reject(op, why or _NOT_FOUND))
                self.counters.rejected += 1
                self._decided(op, entry)
                continue
            if promotable(op, records) is None:
                del self.parked[txn]
                self.out.append(Promote(op, records))
                self.counters.promoted += 1
                self._decided(op, entry)
        return None

    # -- put-back and memory -----------------------------------------------------------------

    def _put_back(self, older_than_ms: int, limit: int, unmovable: Container[str]) -> Need | None:
        """Re-append pending transactions whose oldest record is older than the threshold.

        Entries are visited in the order they were read, which is (nearly) offset order, and
        the visit stops at the first young one, so a batch costs what it puts back.
        """
        due: list[Entry] = []
        for entry in self.pending.values():  # no copy of the whole dict: only what is due
            if len(due) >= limit or entry.first_ts_ms > older_than_ms:
                break
            if entry.txn_id not in unmovable:
                due.append(entry)
        for entry in due:
            if entry.evicted:
                if entry.txn_id not in self.fetched:
                    return Need(entry.txn_id, entry.offsets())
                found = self.fetched[entry.txn_id]
                if found is None:
                    continue  # gone from the log: its op will be rejected when it comes
                records = tuple(found[i] for i in sorted(found))
            else:
                records = tuple(entry.records[i] for i in sorted(entry.records))
            self.out.append(PutBack(records))
            self.counters.put_back += 1
            self.in_flight[entry.txn_id] = (self.op_position, len(records))
            self._forget(entry.txn_id)
        return None

    def _candidate(self, txn_id: str) -> None:
        self.unevicted.append(txn_id)
        if len(self.unevicted) > 2 * len(self.pending) + 1024:  # mostly decided ones: trim
            self.unevicted = deque(t for t, e in self.pending.items() if not e.evicted)

    def _evict(self) -> None:
        if self.held <= self.max_held_records:
            return
        candidates = self.unevicted
        while self.held > self.max_held_records and candidates:  # the oldest go first
            entry = self.pending.get(candidates.popleft())
            if entry is None or entry.evicted:
                continue
            self.held -= len(entry.records)
            self.counters.evicted += len(entry.records)
            entry.records = {}
            entry.evicted = True

    def _forget(self, txn_id: str) -> None:
        entry = self.pending.pop(txn_id, None)
        if entry is not None and not entry.evicted:
            self.held -= len(entry.records)

    def _remember(self, txn_id: str, state: OpState) -> None:
        assert state in TERMINAL_STATES
        self.decided[txn_id] = state
        self.decided.move_to_end(txn_id)
        while len(self.decided) > self.decided_memory:
            self.decided.popitem(last=False)

    # -- views -------------------------------------------------------------------------------

    @property
    def pending_records(self) -> int:
        return sum(len(e.where) for e in self.pending.values())

    def oldest_pending_ms(self) -> int | None:
        return min((e.first_ts_ms for e in self.pending.values()), default=None)

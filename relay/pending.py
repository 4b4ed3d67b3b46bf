"""The undecided transactions of one half partition: where their records are, the records
themselves while the memory cap allows, which of them are due to be put back, and those put
back whose copies are still on their way.

Memory is bounded by ``max_held_records``: beyond it the values of the oldest undecided records
are dropped (the transaction is *evicted*) and read back by offset (``outbox.fetch``) when their
COMMIT arrives or when they are put back. Where they are is always kept: the committed half
offset must never pass a record of a pending transaction.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Container, Iterable
from dataclasses import dataclass, field

from outbox.protocol.half import HalfRecord
from outbox.protocol.op import OpRecord
from relay.actions import Need


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


class Pending:
    """Undecided transactions by id, in the order they were first read (which is, nearly,
    offset order: put-back visits them in it)."""

    def __init__(self, max_held_records: int = 10_000) -> None:
        self.max_held_records = max_held_records
        self.entries: dict[str, Entry] = {}
        #: Records whose values are in memory now.
        self.held = 0
        #: Pending transactions whose records may still be held, in read order: the eviction
        #: candidates (stale ids are skipped), so evicting never rescans evicted entries.
        self.unevicted: deque[str] = deque()
        #: Put back, copies not read back yet: txn id -> (op position at put-back, copies left).
        #: Still undecided; its op waits until the copies are read.
        self.in_flight: dict[str, tuple[int, int]] = {}
        #: Records read back by offset since the last batch, by transaction (None: not found).
        self.fetched: dict[str, dict[int, HalfRecord] | None] = {}

    def __contains__(self, txn_id: object) -> bool:
        return txn_id in self.entries

    def get(self, txn_id: str) -> Entry | None:
        return self.entries.get(txn_id)

    # -- records in, transactions out ------------------------------------------------------

    def open(self, txn_id: str, group: str, *, op_pos: int) -> Entry:
        """A transaction not pending yet; ``op_pos`` bounds the rebuild scan for it."""
        entry = Entry(txn_id, sys.intern(group), op_pos=op_pos)
        self.entries[txn_id] = entry
        self._candidate(txn_id)
        return entry

    def open_with(self, record: HalfRecord, *, op_pos: int) -> int:
        """:meth:`open` and :meth:`add` in one, for the first record read of a transaction
        (the common case: one call per transaction, the entry built filled); returns how many
        held values were dropped to stay under the cap."""
        txn_id = record.txn_id
        index = record.index
        self.entries[txn_id] = Entry(
            txn_id,
            sys.intern(record.producer_group),
            op_pos,
            {index: (record.offset, record.timestamp_ms)},
            {index: record},
        )
        self._candidate(txn_id)
        self.held += 1
        return self._evict() if self.held > self.max_held_records else 0

    def add(self, entry: Entry, record: HalfRecord) -> int:
        """A record of ``entry`` was read (a newer copy replaces what was read); returns how
        many held values were dropped to stay under the cap."""
        old = entry.where.get(record.index)
        if old is None or record.offset > old[0]:
            entry.where[record.index] = (record.offset, record.timestamp_ms)
            if not entry.evicted:
                self.held += record.index not in entry.records
                entry.records[record.index] = record
        return self._evict() if self.held > self.max_held_records else 0

    def hold(self, txn_id: str, group: str, records: Iterable[HalfRecord], *, op_pos: int) -> int:
        """Pending again, with records read back by offset (a parked COMMIT, a resumed
        transaction); returns how many held values were dropped to stay under the cap."""
        entry = Entry(txn_id, group, op_pos=op_pos)
        for record in records:
            entry.where[record.index] = (record.offset, record.timestamp_ms)
            entry.records[record.index] = record
        self.entries[txn_id] = entry
        self._candidate(txn_id)
        self.held += len(entry.records)
        return self._evict() if self.held > self.max_held_records else 0

    def forget(self, txn_id: str) -> None:
        """Decided or put back: no longer pending here."""
        entry = self.entries.pop(txn_id, None)
        if entry is not None and not entry.evicted:
            self.held -= len(entry.records)

    def sent_back(self, txn_id: str, op_position: int, copies: int) -> None:
        """``txn_id`` is put back: pending again once its ``copies`` are read back."""
        self.in_flight[txn_id] = (op_position, copies)
        self.forget(txn_id)

    def copy_read(self, txn_id: str) -> None:
        """A put-back copy of ``txn_id`` was read back (the caller checked it is in flight)."""
        pos, left = self.in_flight[txn_id]
        if left <= 1:
            del self.in_flight[txn_id]
        else:
            self.in_flight[txn_id] = (pos, left - 1)

    def due(self, older_than_ms: int, limit: int, unmovable: Container[str]) -> list[Entry]:
        """Up to ``limit`` transactions to put back: those whose oldest record is older than
        ``older_than_ms`` (broker time), except the ``unmovable`` ones.

        Entries are visited in the order they were read, which is (nearly) offset order, and
        the visit stops at the first young one, so a batch costs what it puts back.
        """
        due: list[Entry] = []
        for entry in self.entries.values():  # no copy of the whole dict: only what is due
            if len(due) >= limit or entry.first_ts_ms > older_than_ms:
                break
            if entry.txn_id not in unmovable:
                due.append(entry)
        return due

    # -- records with their values ---------------------------------------------------------

    def supply(self, txn_id: str, records: Iterable[HalfRecord] | None) -> None:
        """Answer a :class:`Need`: the records found at its offsets (None: not found)."""
        self.fetched[txn_id] = None if records is None else {r.index: r for r in records}

    def records_of(self, op: OpRecord) -> tuple[HalfRecord, ...] | Need | None:
        """The op's records with their values, from memory or a fetch; None if not found."""
        count = op.message_count
        if not count:
            return ()  # nothing to look for: the state refuses it (relay.whole.part_of)
        entry = self.entries.get(op.txn_id)
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

    def copies_of(self, entry: Entry) -> tuple[HalfRecord, ...] | Need | None:
        """The records of ``entry`` to put back, from memory or a fetch; None if gone from
        the log (its op will be rejected when it comes)."""
        if not entry.evicted:
            return tuple(entry.records[i] for i in sorted(entry.records))
        if entry.txn_id not in self.fetched:
            return Need(entry.txn_id, entry.offsets())
        found = self.fetched[entry.txn_id]
        return None if found is None else tuple(found[i] for i in sorted(found))

    # -- views -----------------------------------------------------------------------------

    @property
    def records(self) -> int:
        """Pending half records, held or not."""
        return sum(len(e.where) for e in self.entries.values())

    def oldest_ms(self) -> int | None:
        """Broker timestamp of the oldest pending record."""
        return min((e.first_ts_ms for e in self.entries.values()), default=None)

    # -- the memory cap --------------------------------------------------------------------

    def _candidate(self, txn_id: str) -> None:
        self.unevicted.append(txn_id)
        if len(self.unevicted) > 2 * len(self.entries) + 1024:  # mostly decided ones: trim
            self.unevicted = deque(t for t, e in self.entries.items() if not e.evicted)

    def _evict(self) -> int:
        """Drop the values of the oldest held transactions until the cap is met."""
        evicted = 0
        candidates = self.unevicted
        while self.held > self.max_held_records and candidates:  # the oldest go first
            entry = self.entries.get(candidates.popleft())
            if entry is None or entry.evicted:
                continue
            self.held -= len(entry.records)
            evicted += len(entry.records)
            entry.records = {}
            entry.evicted = True
        return evicted

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
  put back (re-appended) so it keeps moving. Hence a terminal op naming half records the reader
  has passed, for a transaction neither pending nor on its way back, is a repeat: it is counted
  and never acted on, however late it comes (no memory of decisions is needed for that).
* Parked COMMITs are remembered on the state topic (a :class:`relay.actions.Remember` in the
  same Kafka transaction), never in the bounded offset-commit metadata.

Its parts: the undecided transactions (:mod:`relay.pending`), the decisions remembered
(:mod:`relay.decisions`), which COMMITs can be carried out (:mod:`relay.whole`), the common
COMMIT's fast path (:mod:`relay.held`), parked COMMITs tried again (:mod:`relay.parked`),
put-back (:mod:`relay.put_back`) and the op time it is measured on (:mod:`relay.op_frontier`),
what it hands out (:mod:`relay.actions`), the progress it commits (:mod:`relay.progress`) and
the op offset a rebuild would start from (:mod:`relay.rebuild_point`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Container, Iterable
from dataclasses import dataclass, field

from outbox.protocol.half import HalfRecord
from outbox.protocol.op import OpRecord
from outbox.protocol.states import OpState
from relay.actions import (
    Action,
    BadRecord,
    Batch,
    Counters,
    Drop,
    Need,
    Promote,
    Reject,
    Remember,
)
from relay.decisions import Decisions
from relay.held import promote_held
from relay.op_frontier import OpFrontier
from relay.parked import retry_parked
from relay.pending import Pending
from relay.progress import Progress
from relay.put_back import put_back
from relay.rebuild_point import RebuildPoint
from relay.whole import (
    GAP,
    NOT_FOUND,
    Promotable,
    StillParked,
    always,
    never_parked,
    refused,
    topics_of,
)


@dataclass
class PartitionState:
    """State of partition number ``partition`` of the half and op topics."""

    partition: int
    half_position: int = 0
    op_position: int = 0
    max_held_records: int = 10_000
    #: Copies put back by an earlier life of this state may lie before this half offset; until
    #: the reader passes it, decisions are remembered and a non-pending op's fate waits.
    resumed_end: int = 0
    #: Half offsets [from, to) lost to retention unread (:class:`relay.progress.Progress`).
    gap: tuple[int, int] | None = None
    pending: Pending = field(init=False)
    decided: Decisions = field(default_factory=Decisions)
    #: Ops read, not handled yet, in partition order: (offset, op, broker stamp).
    queue: deque[tuple[int, OpRecord | None, int | None]] = field(default_factory=deque)
    #: How far the op partition is known read: what put-back is measured on.
    op_frontier: OpFrontier = field(default_factory=OpFrontier)
    #: COMMITs handled but not written yet (topic missing or refused): txn id -> op.
    parked: dict[str, OpRecord] = field(default_factory=dict)
    #: The real topics a parked transaction writes to, once its records were read here.
    parked_topics: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: The op offset a rebuild would start from, as decisions are made ahead of the reader.
    rebuild_point: RebuildPoint = field(default_factory=RebuildPoint)
    #: Actions decided since the last batch was handed out.
    out: list[Action] = field(default_factory=list)
    counters: Counters = field(default_factory=Counters)
    _log_end: int = 0
    #: The parked COMMITs the batch being taken has yet to retry, in the order they were
    #: parked (:func:`relay.parked.retry_parked`); None until the batch begins retrying them.
    #: A read-back (a Need) re-enters take, which goes on from where it stopped.
    parked_to_retry: deque[str] | None = None

    def __post_init__(self) -> None:
        self.pending = Pending(self.max_held_records)

    # -- input -------------------------------------------------------------------------------

    def add_half(self, record: HalfRecord) -> None:
        self.half_position = max(self.half_position, record.offset + 1)
        txn = record.txn_id
        pending = self.pending
        if txn in pending.in_flight:
            pending.copy_read(txn)
        if txn in self.decided:
            return  # handled before (a re-read after a restart, or a copy of a decided one)
        entry = pending.entries.get(txn)
        if entry is None:  # its first record: the entry is built filled
            op_pos = self.rebuild_point.floor(self.op_position)
            evicted = pending.open_with(record, op_pos=op_pos)
        else:
            evicted = pending.add(entry, record)
        if evicted:
            self.counters.evicted += evicted

    def half_read_to(self, end: int) -> None:
        """The consumer read the half partition to its end at ``end`` (read_committed: every
        committed record below it was delivered; the offsets it skipped were commit markers or
        aborted records). Without this, a partition ending in a marker - after the relay's own
        put-back copies - would never count as read past its end until another record came, and
        an op held until the reader passes ``resumed_end`` would wait that long."""
        if end > self.half_position:
            self.half_position = end

    def add_op(self, offset: int, op: OpRecord | None, timestamp_ms: int | None = None) -> None:
        """Queue an op in partition order; None for a tombstone or an undecodable one.
        ``timestamp_ms`` is its broker stamp (None: none known)."""
        self.queue.append((offset, op, timestamp_ms))
        self.op_frontier.read(timestamp_ms)

    def add_bad(self, bad: BadRecord, *, half: bool, timestamp_ms: int | None = None) -> None:
        """An undecodable record: dead-lettered with the next batch, its offset passed."""
        self.out.append(bad)
        self.counters.bad_records += 1
        if half:
            self.half_position = max(self.half_position, bad.offset + 1)
        else:
            self.add_op(bad.offset, None, timestamp_ms)

    def supply(self, txn_id: str, records: Iterable[HalfRecord] | None) -> None:
        """Answer a :class:`Need`: the records found at its offsets (None: not found)."""
        self.pending.supply(txn_id, records)

    # -- output ------------------------------------------------------------------------------

    def take(
        self,
        now_ms: int,
        *,
        put_back_after_ms: int,
        log_end: int = 0,
        verified_end: int | None = None,
        promotable: Promotable = always,
        still_parked: StillParked = never_parked,
        max_put_back: int = 1000,
        unmovable: Container[str] = frozenset(),
    ) -> Batch | Need:
        """Everything that can be done now, or the records needed before going on.

        After a :class:`Need`, :meth:`supply` the records and call again: what was decided so
        far is kept. ``now_ms`` is the broker's time; a pending transaction is put back once
        undecided for ``put_back_after_ms`` as of the ops read and handled
        (:mod:`relay.op_frontier`), not merely by ``now_ms``. ``log_end`` is the half partition's
        end offset as last seen;
        ``verified_end`` is one just read from the broker, when the relay had reason to ask: an
        op naming records at or past it can never be carried out (producers write their half
        records before their op). ``still_parked`` is asked about a parked transaction whose
        records are not in memory before they are read back. Transactions in ``unmovable`` are
        never put back (their copies were refused): they stay pending where they are.
        """
        self._log_end = max(self._log_end, log_end, self.half_position, self.resumed_end)
        # Parked COMMITs first: a topic-wide condition (the topic missing, or not writable by
        # the relay) parks every COMMIT to the topic in op order, and when it clears they go
        # before the COMMITs read since, on their keys too. Once a batch.
        need = retry_parked(self, promotable, still_parked)
        if need is None:
            need = self._handle_ops(verified_end, promotable)
        if need is None:
            need = put_back(
                self,
                now_ms,
                put_back_after_ms=put_back_after_ms,
                limit=max_put_back,
                unmovable=unmovable,
            )
        if need is not None:
            return need
        actions, self.out = self.out, []
        self.begin_batch()
        self.pending.fetched.clear()
        self.rebuild_point.passed(self.half_position)
        if self.half_position >= self.resumed_end:
            self.resumed_end = 0  # no copy an earlier life put back can come any more
        self.decided.expire(self.half_position)
        progress = self.progress()
        return Batch(actions, progress.half_offset, progress.op_offset, progress.metadata())

    def begin_batch(self) -> None:
        """The next take begins a batch: it retries every parked COMMIT again. (Also when the
        last take ended at a Need nobody answered.)"""
        self.parked_to_retry = None

    @property
    def op_read_position(self) -> int:
        """The next op offset to read (ops read but not handled yet wait in the queue)."""
        return self.queue[-1][0] + 1 if self.queue else self.op_position

    def waiting_op(self) -> OpRecord | None:
        """The op at the head of the queue when it waits for half records, else None."""
        return self.queue[0][1] if self.queue else None

    def progress(self) -> Progress:
        entries = self.pending.entries
        pending_offsets = [e.first_offset for e in entries.values()]
        half = min([*pending_offsets, self.half_position])
        rebuild_from = min(
            [
                self.op_position,
                *(e.op_pos for e in entries.values()),
                # not needed by the invariant (a transaction in flight is undecided), kept as
                # a margin: it only delays the rebuild point while copies travel
                *(pos for pos, _ in self.pending.in_flight.values()),
                *self.rebuild_point.bounds(),
            ]
        )
        return Progress(half, self.op_position, rebuild_from, self.gap)

    # -- ops ---------------------------------------------------------------------------------

    def _handle_ops(self, verified_end: int | None, promotable: Promotable) -> Need | None:
        while self.queue:
            offset, op, _ = self.queue[0]
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
        if promote_held(self, op, verified_end, promotable):
            return True  # the common case, decided by the fast path (relay.held)
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
        if self.half_position <= last or txn in self.pending.in_flight:
            return False
        if txn not in self.pending.entries:
            return self._not_pending(op, last)
        if op.state is not OpState.COMMIT:
            self.out.append(Drop(op))
            self.counters.dropped += 1
            self._decided(op)
            return True
        return self._commit(op, promotable)

    def _not_pending(self, op: OpRecord, last: int) -> bool:
        """An op whose half records the reader has passed, for a transaction that is not
        pending: it was decided before (a repeat), unless its records never reached the reader.

        True: handled. False: copies an earlier life put back may still lie ahead (the
        transaction is pending again once they are read), so the op waits for the reader.
        """
        if self.half_position < self.resumed_end:
            return False
        gap = self.gap
        if op.state is OpState.COMMIT and gap is not None and gap[0] <= last < gap[1]:
            return self._reject(op, GAP)
        self.counters.repeats += 1
        return True

    def _commit(self, op: OpRecord, promotable: Promotable) -> bool | Need:
        """A COMMIT whose half records the reader has passed: promote, park or reject it."""
        records = self.pending.records_of(op)
        if isinstance(records, Need):
            return records
        if records is None:
            return self._reject(op, NOT_FOUND)
        entry = self.pending.get(op.txn_id)
        why = refused(op, records, None if entry is None else entry.where)
        if why is not None:
            return self._reject(op, why)
        if promotable(op, records) is not None:
            self.parked[op.txn_id] = op
            self.parked_topics[op.txn_id] = topics_of(records)
            self.out.append(Remember(op.txn_id, op))
            if op.txn_id not in self.pending.entries:
                self._hold(op.txn_id, op.producer_group, records, op_pos=op.offset)
            return True
        self.out.append(Promote(op, records))
        self.counters.promoted += 1
        self._decided(op)
        return True

    def decided_now(self, op: OpRecord) -> None:
        """``op`` was carried out (or refused): remembered while copies may lie ahead."""
        self._decided(op)

    def _decided(self, op: OpRecord) -> None:
        if self.half_position < self._log_end:  # a copy put back before may lie ahead
            self.decided.remember(op.txn_id, op.state, until=self._log_end)
        if self.parked.pop(op.txn_id, None) is not None:
            self.parked_topics.pop(op.txn_id, None)
            self.out.append(Remember(op.txn_id, None))
        self.pending.forget(op.txn_id)
        self.rebuild_point.bound(op.offset, self.half_position, self._log_end)

    def _reject(self, op: OpRecord, reason: str) -> bool:
        self.out.append(Reject(op, reason))
        self.counters.rejected += 1
        self._decided(op)
        return True

    def _resume(self, op: OpRecord) -> bool | Need:
        """A given-up transaction put back to be checked: undecided again, its copies pending."""
        txn = op.txn_id
        self.decided.pop(txn, None)
        if txn in self.pending.entries:
            return True
        if op.txn_id not in self.pending.fetched:
            if self.half_position <= max(op.half_offsets, default=-1):
                return True  # the reader has not reached the copies: it will find them
            return Need(txn, op.half_offsets)
        found = self.pending.fetched[txn]
        if found:
            self._hold(txn, op.producer_group, found.values(), op_pos=op.offset)
        return True

    # -- memory ------------------------------------------------------------------------------

    def _hold(self, txn_id: str, group: str, records: Iterable[HalfRecord], *, op_pos: int) -> None:
        op_pos = min(op_pos, self.rebuild_point.floor(self.op_position))
        self.counters.evicted += self.pending.hold(txn_id, group, records, op_pos=op_pos)

    # -- views -------------------------------------------------------------------------------

    @property
    def held(self) -> int:
        """Pending half records whose values are in memory."""
        return self.pending.held

    @property
    def pending_records(self) -> int:
        return self.pending.records

    def oldest_pending_ms(self) -> int | None:
        return self.pending.oldest_ms()

"""What a partition's state hands out: the actions of the next Kafka transaction, the batch they
form with the progress to commit, the records it needs read back before it can go on, and the
counts of what it decided.

Pure data, no Kafka: :class:`relay.state.PartitionState` makes them, the relay's writer carries
them out (:mod:`relay.writer`), and a test reads them as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

from outbox.protocol.half import HalfRecord
from outbox.protocol.op import OpRecord


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


@dataclass(frozen=True)
class Remember:
    """A state record for ``txn_id`` (:mod:`outbox.protocol.state`): ``op`` is a parked COMMIT
    to remember across restarts, None that there is nothing to remember any more."""

    txn_id: str
    op: OpRecord | None


Action = Promote | Drop | PutBack | Reject | BadRecord | Remember


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
    """What a partition's state decided since its counters were last collected (at each
    committed Kafka transaction, by :class:`relay.accounting.Accounting`)."""

    promoted: int = 0
    dropped: int = 0
    rejected: int = 0
    put_back: int = 0
    duplicates: int = 0
    conflicts: int = 0
    #: Terminal ops for transactions decided before, recognised by position (the first
    #: decision is no longer remembered, so neither a duplicate nor a conflict can be told).
    repeats: int = 0
    bad_records: int = 0
    evicted: int = 0

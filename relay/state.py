"""What one relay knows about one partition pair (half partition p, op partition p).

Pure logic, no Kafka: records go in, promotion decisions come out in the order of the op
partition, so transactions on one key are promoted in the order of their COMMIT ops. The
offsets it allows to be committed never pass a half record whose transaction is not handled, so
a restart reads every pending half again.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from outbox.protocol.half import HalfRecord
from outbox.protocol.op import OpRecord
from outbox.protocol.states import OpState

#: How many handled transactions are remembered to recognise repeated ops and re-read halves.
DECIDED_MEMORY = 200_000


@dataclass(frozen=True)
class Promote:
    """Write these records (in message-index order) to their real topics."""

    op: OpRecord
    records: tuple[HalfRecord, ...]


@dataclass(frozen=True)
class Drop:
    """Rolled back or given up: these records are never delivered."""

    op: OpRecord
    records: tuple[HalfRecord, ...]


@dataclass(frozen=True)
class Missing:
    """A COMMIT whose half records were read past but not found (e.g. removed by retention)."""

    op: OpRecord
    missing_offsets: tuple[int, ...]


Action = Promote | Drop | Missing


@dataclass
class Counters:
    promoted: int = 0
    dropped: int = 0
    missing: int = 0
    duplicates: int = 0
    conflicts: int = 0


@dataclass
class PartitionState:
    """State of partition number ``partition`` of the half and op topics."""

    partition: int
    half_position: int = 0
    op_done: int = 0
    decided: OrderedDict[str, OpState] = field(default_factory=OrderedDict)
    halves: dict[str, dict[int, HalfRecord]] = field(default_factory=dict)
    queue: deque[tuple[int, OpRecord | None]] = field(default_factory=deque)
    counters: Counters = field(default_factory=Counters)

    def add_half(self, record: HalfRecord) -> None:
        self.half_position = max(self.half_position, record.offset + 1)
        if record.txn_id in self.decided:
            return  # a transaction handled before a restart: read again, not pending
        self.halves.setdefault(record.txn_id, {})[record.offset] = record

    def skip_half(self, offset: int) -> None:
        """An undecodable half record (sent to the dead-letter topic) was read."""
        self.half_position = max(self.half_position, offset + 1)

    def add_op(self, offset: int, op: OpRecord | None) -> None:
        """Queue an op in partition order; None for one that was undecodable or a tombstone."""
        self.queue.append((offset, op))

    def remember(self, txn_id: str, state: OpState) -> None:
        self.decided[txn_id] = state
        self.decided.move_to_end(txn_id)
        while len(self.decided) > DECIDED_MEMORY:
            self.decided.popitem(last=False)

    def ready(self) -> list[Action]:
        """Actions for the ops at the head of the queue, stopping at a COMMIT still waiting."""
        actions: list[Action] = []
        while self.queue:
            offset, op = self.queue[0]
            if op is not None:
                if op.txn_id in self.decided:
                    self._repeated(op)
                else:
                    action = self._decide(op)
                    if action is None:
                        break
                    actions.append(action)
            self.queue.popleft()
            self.op_done = offset + 1
        return actions

    def _repeated(self, op: OpRecord) -> None:
        if self.decided[op.txn_id] is op.state:
            self.counters.duplicates += 1
        else:
            self.counters.conflicts += 1

    def _decide(self, op: OpRecord) -> Action | None:
        have = self.halves.get(op.txn_id, {})
        action: Action
        if op.state is not OpState.COMMIT:
            action = Drop(op, tuple(have[o] for o in sorted(have)))
            self.counters.dropped += 1
        elif all(o in have for o in op.half_offsets):
            action = Promote(op, tuple(have[o] for o in op.half_offsets))
            self.counters.promoted += 1
        elif self.half_position > max(op.half_offsets):
            action = Missing(op, tuple(o for o in op.half_offsets if o not in have))
            self.counters.missing += 1
        else:
            return None  # its halves are not read yet: wait, keeping COMMIT order
        self.halves.pop(op.txn_id, None)
        self.remember(op.txn_id, op.state)
        return action

    def safe_offsets(self) -> tuple[int, int]:
        """(half, op) offsets that may be committed: nothing pending lies before them."""
        pending = [o for records in self.halves.values() for o in records]
        half = min([*pending, self.half_position])
        return half, self.op_done

    @property
    def pending(self) -> int:
        return sum(len(r) for r in self.halves.values())

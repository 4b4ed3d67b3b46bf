"""The fast path of a COMMIT: its transaction's records all held, nothing unusual about it.

A relay draining a backlog meets one case almost every time: a COMMIT whose half records the
reader has passed and holds in memory, for a transaction that is pending, neither decided nor
parked before nor on its way back as put-back copies. :func:`promote_held` carries out exactly
that case with the checks it needs and the least Python: no generator, no ``Need``, the
:class:`relay.actions.Promote` built without its frozen ``__init__``. Anything else - a repeat,
a conflict, an evicted or incomplete transaction, a record past the verified end, a COMMIT
whose topic refuses it (parked) - returns None and takes the general path
(:meth:`relay.state.PartitionState._handle`), which decides it the same way it always did.
``tests/relay/test_held.py`` feeds the same inputs through both and compares what they hand out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outbox.protocol.frozen import frozen
from outbox.protocol.half import HalfRecord
from outbox.protocol.op import OpRecord
from outbox.protocol.states import OpState
from relay.actions import Promote
from relay.whole import Promotable, part_of

if TYPE_CHECKING:
    from relay.state import PartitionState

_COMMIT = OpState.COMMIT


def promote_held(
    state: PartitionState, op: OpRecord, verified_end: int | None, promotable: Promotable
) -> bool:
    """Promote ``op``'s transaction when it is the common case; False when it is not (the
    caller then takes the general path, nothing having changed)."""
    if op.state is not _COMMIT:
        return False
    txn = op.txn_id
    pending = state.pending
    entry = pending.entries.get(txn)
    if entry is None or entry.evicted or txn in state.decided or txn in state.parked:
        return False
    offsets = op.half_offsets
    count = len(offsets)
    if not count or txn in pending.in_flight or len(entry.where) > count:
        return False  # (more records read than named: relay.whole.left_out refuses it)
    last = max(offsets)
    if last >= state.half_position or (verified_end is not None and last >= verified_end):
        return False
    held = entry.records
    if count == 1:
        record = held.get(0)
        if record is None:
            return False
        records: tuple[HalfRecord, ...] = (record,)
    else:
        try:
            records = tuple([held[i] for i in range(count)])
        except KeyError:
            return False
    if part_of(records) is not None or promotable(op, records) is not None:
        return False  # refused or parked: the general path says so and acts on it
    state.out.append(frozen(Promote, {"op": op, "records": records}))
    state.counters.promoted += 1
    state.decided_now(op)
    return True

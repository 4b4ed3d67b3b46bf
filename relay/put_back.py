"""Put-back: re-appending the records of a transaction undecided for ``put_back_after_s``, so
the committed half offset keeps moving past it (RocketMQ's put-back).

"Undecided for that long" is measured on the ops the partition has read and handled
(:mod:`relay.op_frontier`), not on the relay's clock alone: while the relay catches up it
reads a half partition ahead of its op partition, and by the clock the whole backlog would look
undecided for as long as the relay was down.
"""

from __future__ import annotations

from collections.abc import Container
from typing import TYPE_CHECKING

from relay.actions import Need, PutBack

if TYPE_CHECKING:
    from relay.state import PartitionState


def put_back(
    state: PartitionState,
    now_ms: int,
    *,
    put_back_after_ms: int,
    limit: int,
    unmovable: Container[str],
) -> Need | None:
    """Put back up to ``limit`` transactions undecided for ``put_back_after_ms`` as of the ops
    handled, except the ``unmovable`` ones; the records to read back first, if any."""
    known = ops_known_to(state, now_ms)
    if known is None:
        return None  # nothing known of the op partition yet: nothing is put back
    pending = state.pending
    for entry in pending.due(known - put_back_after_ms, limit, unmovable):
        records = pending.copies_of(entry)
        if isinstance(records, Need):
            return records
        if records is None:
            continue  # gone from the log: its op will be rejected when it comes
        state.out.append(PutBack(records))
        state.counters.put_back += 1
        pending.sent_back(entry.txn_id, state.op_position, len(records))
    return None


def ops_known_to(state: PartitionState, now_ms: int) -> int | None:
    """The broker time up to which the partition's ops are read and handled (None: unknown
    yet). An op waiting at the head of the queue is not handled, nor is any behind it: its stamp
    bounds the time. Every such wait ends as the half reader moves on - to the records the op
    names, to copies put back, to the end the partition had at a restart
    (:meth:`relay.state.PartitionState.half_read_to`) - or with the op found to name records
    past the end."""
    known = state.op_frontier.known_to(now_ms)
    if known is not None and state.queue:
        head = state.queue[0][2]
        if head is not None and head < known:
            return head
    return known

"""Parked COMMITs tried again: each batch, every COMMIT whose real topic did not take it yet
(missing, or a record refused) is asked again whether it can go (:mod:`relay.refusals`).

The question needs its records. When their values were dropped under ``max_held_records`` they
are read back by offset, a broker round trip each (``outbox.fetch``); asked every batch, that
was one round trip per parked transaction per batch only to hear again that the topic was
missing (1,000 parked on a partition: 1,000 a batch). So the topics a parked transaction writes
to are remembered once read, and asked about by name first
(:data:`relay.whole.StillParked`); its records are read back only when it may go.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from relay.actions import Need, Promote, Reject
from relay.whole import NOT_FOUND, Promotable, StillParked, refused, topics_of

if TYPE_CHECKING:
    from relay.state import PartitionState


def retry_parked(
    state: PartitionState, promotable: Promotable, still_parked: StillParked
) -> Need | None:
    """Promote the parked COMMITs that can go now (or reject those that never can), each
    once a batch, in the order they were parked; the records to read back first, if any.

    After a :class:`Need` the batch's take comes back here and goes on from the transaction
    that needed its records: it used to scan every parked one again, at each read-back
    (200 restored parked transactions over the memory cap: 18,155 questions, now 200)."""
    todo = state.parked_to_retry
    if todo is None:
        todo = state.parked_to_retry = deque(state.parked)
    while todo:
        need = _retry(state, todo[0], promotable, still_parked)
        if need is not None:
            return need
        todo.popleft()
    return None


def _retry(
    state: PartitionState, txn: str, promotable: Promotable, still_parked: StillParked
) -> Need | None:
    pending = state.pending
    op = state.parked.get(txn)
    if op is None:
        return None  # decided meanwhile
    if txn in pending.in_flight:
        return None  # put back meanwhile: retried once its copies are read back
    entry = pending.entries.get(txn)
    if entry is None and state.half_position < state.resumed_end:
        return None  # restored from the state topic: retried once the reader finds it
    names = state.parked_topics.get(txn)
    if (
        names is not None
        and (entry is None or entry.evicted)
        and txn not in pending.fetched
        and still_parked(op, names) is not None
    ):
        return None  # its records are not read back only to hear that again
    records = pending.records_of(op)
    if isinstance(records, Need):
        return records
    why = (
        NOT_FOUND
        if records is None
        else refused(op, records, None if entry is None else entry.where)
    )
    if records is None or why is not None:  # parked by an older relay, or a record read since
        state.out.append(Reject(op, why or NOT_FOUND))
        state.counters.rejected += 1
        state.decided_now(op)
        return None
    if promotable(op, records) is None:
        state.out.append(Promote(op, records))
        state.counters.promoted += 1
        state.decided_now(op)
    elif names is None:
        state.parked_topics[txn] = topics_of(records)
    return None

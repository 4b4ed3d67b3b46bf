"""Which COMMITs the relay may carry out now: a COMMIT delivers the whole of its transaction or
nothing, and only once the topics it writes to take its records.
"""

from __future__ import annotations

from collections.abc import Callable

from outbox.protocol.half import HalfRecord
from outbox.protocol.op import OpRecord

#: Decides whether a transaction's records can be written now (their topics exist, nothing
#: refused them lately). Returns None when they can, else the reason they wait.
Promotable = Callable[[OpRecord, tuple[HalfRecord, ...]], str | None]


def always(op: OpRecord, records: tuple[HalfRecord, ...]) -> str | None:
    return None


#: The same question for a parked transaction by the topics its records write to, asked before
#: its records are read back by offset (their values dropped under the memory cap): reading
#: them back every batch only to be told again that the topic is missing would cost a broker
#: round trip per parked transaction per batch. None when it may go, else why it still waits.
StillParked = Callable[[OpRecord, tuple[str, ...]], str | None]


def never_parked(op: OpRecord, topics: tuple[str, ...]) -> str | None:
    return None


def topics_of(records: tuple[HalfRecord, ...]) -> tuple[str, ...]:
    """The real topics ``records`` write to, each once, sorted."""
    return tuple(sorted({r.message.topic for r in records}))


NOT_FOUND = "its half records were not found (retention?)"
GAP = "its half records were removed by retention before the relay read them"


def part_of(records: tuple[HalfRecord, ...]) -> str | None:
    """Why promoting ``records``, the ones a COMMIT names, would deliver part of a transaction
    or nothing (None: it would deliver all of it). The records are the op's indexes 0..n-1
    (``Pending.records_of``), so only their message count can say more are missing; once per
    promotion."""
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

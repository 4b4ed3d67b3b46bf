"""Which COMMITs the relay may carry out now: a COMMIT delivers the whole of its transaction or
nothing, and only once the topics it writes to take its records.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

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


def left_out(op: OpRecord, read: Mapping[int, tuple[int, int]]) -> str | None:
    """Why promoting the records ``op`` names would leave out a message of its transaction
    that the relay has read (None: it read none beyond them). ``read`` maps the message
    indexes of the transaction's half records read to their (offset, broker time).

    Messages sent one by one carry no count for :func:`part_of` to check. But a producer
    commits only once every send of the transaction was acknowledged (a send that failed breaks
    it: it rolls back), so a record of index ``n`` or more under a COMMIT naming ``n`` is one of
    its messages the COMMIT left out - a decision made from part of the transaction - and
    promoting the named ones would lose the rest without a word."""
    n = len(op.half_offsets)
    beyond = sorted(i for i in read if i >= n)
    if not beyond:
        return None
    plural = "s" if len(beyond) > 1 else ""
    return (
        f"names {n} half record(s) (offsets {_listed(op.half_offsets)}), but the relay read "
        f"message{plural} {_listed(beyond)} of the transaction too (offset{plural} "
        f"{_listed([read[i][0] for i in beyond])}): a decision made from part of its records. "
        "Promoting the named ones would deliver part of the transaction: re-send its messages "
        "from their source"
    )


#: How many offsets or message indexes a refusal names at most.
_SHOWN = 10


def _listed(numbers: Sequence[int]) -> str:
    """The first :data:`_SHOWN` of ``numbers`` (a transaction may have thousands)."""
    more = ", ..." if len(numbers) > _SHOWN else ""
    return ", ".join(str(n) for n in numbers[:_SHOWN]) + more


def refused(
    op: OpRecord, records: tuple[HalfRecord, ...], read: Mapping[int, tuple[int, int]] | None
) -> str | None:
    """Why the COMMIT ``op`` may not promote ``records``, the ones it names (None: it may):
    :func:`part_of`, then :func:`left_out` against the records of its transaction read
    (``read``: None when none is pending here)."""
    return part_of(records) or (None if read is None else left_out(op, read))

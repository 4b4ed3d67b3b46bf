"""Whether the half records in hand are all of one transaction's messages.

The relay refuses a COMMIT naming part of a transaction, and the checker gives up on one whose
records are not all in hand: delivering part of a transaction is worse than delivering none.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice

from outbox.protocol.half import HalfRecord


def why_incomplete(records: Iterable[HalfRecord]) -> str | None:
    """Why ``records``, the half records of one transaction, are not all of it; None if they are.

    A transaction's messages have the indexes 0..n-1, where n is the message count its records
    carry when the producer knew it at send time (``TransactionalProducer``), else one past the
    highest index in hand (messages sent one by one: only a gap shows then). A COMMIT naming
    fewer would deliver part of a transaction, which is worse than delivering none of it.
    Costs O(records), whatever count a record claims.
    """
    records = tuple(records)
    held = {record.index for record in records}
    counts = {record.count for record in records if record.count is not None}
    if not held:
        return "none of its half records is in hand"
    if min(held) < 0:
        return f"message index {min(held)} is negative"
    if len(counts) > 1:
        return f"its half records disagree on its message count ({sorted(counts)})"
    count = counts.pop() if counts else max(held) + 1
    beyond = [i for i in held if i >= count]
    if beyond:
        return f"message index {min(beyond)} is past its message count {count}"
    missing = count - len(held)
    if missing:
        first = list(islice((i for i in range(count) if i not in held), 10))
        shown = ", ".join(map(str, first)) + (", ..." if missing > len(first) else "")
        verb = "is" if missing == 1 else "are"
        return f"{missing} of its {count} messages {verb} missing (index {shown})"
    return None

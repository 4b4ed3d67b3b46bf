"""Dead letters: records that could not be handled, parked whole with the reason.

Key, value and headers are the original record's (for a given-up transaction: each of its half
records, headers included); the ``outbox-dl-*`` headers say why and where it came from. The
``resume`` command appends a marker record (key = the transaction id, null value, header
``outbox-dl-resumed``) after it put a given-up transaction back, so it is never resumed twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

#: The header list type confluent-kafka takes.
HeaderList = list[tuple[str, str | bytes | None]]


class DeadLetterHeader(StrEnum):
    """Headers a dead letter carries besides the original record's own."""

    REASON = "outbox-dl-reason"
    SOURCE_TOPIC = "outbox-dl-source-topic"
    SOURCE_PARTITION = "outbox-dl-source-partition"
    SOURCE_OFFSET = "outbox-dl-source-offset"
    #: Only on a resume marker: when (Unix ms) the transaction was put back to be checked.
    RESUMED_AT = "outbox-dl-resumed"
    #: Only when the dead-letter topic refused the original record (too large for it): why its
    #: key, value and headers are not here; they are at the source offset.
    OMITTED = "outbox-dl-omitted"


#: A longer reason is cut. The decoders quote at most a part of the field they refuse
#: (``outbox.errors.quoted``); this is the guard for every other reason: a dead letter its topic
#: refuses even without the original record would be redone forever.
MAX_REASON_CHARS = 4_000


def dead_letter_headers(
    original: Sequence[tuple[str, bytes | str | None]] | None,
    *,
    reason: str,
    source_topic: str,
    source_partition: int,
    source_offset: int,
) -> HeaderList:
    """The original headers (bytes), then why (cut at :data:`MAX_REASON_CHARS`) and where from."""
    if len(reason) > MAX_REASON_CHARS:
        cut = len(reason) - MAX_REASON_CHARS
        reason = f"{reason[:MAX_REASON_CHARS]}... ({cut:,} more characters cut)"
    headers: HeaderList = [
        (n, v.encode() if isinstance(v, str) else (v or b"")) for n, v in (original or ())
    ]
    headers += [
        (DeadLetterHeader.REASON.value, reason.encode()),
        (DeadLetterHeader.SOURCE_TOPIC.value, source_topic.encode()),
        (DeadLetterHeader.SOURCE_PARTITION.value, str(source_partition).encode()),
        (DeadLetterHeader.SOURCE_OFFSET.value, str(source_offset).encode()),
    ]
    return headers

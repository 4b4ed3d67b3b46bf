"""Put-back copies of half records: the headers a copy carries.

A transaction undecided for long is re-appended to the half topic (RocketMQ's put-back) so that
the committed offsets move on; ``kafka-outbox resume`` appends copies too. A copy is its
record's value under its own headers, in its own schema version, with ``outbox-origin-offset``
naming the original.
"""

from __future__ import annotations

from outbox.protocol.half import HalfRecord, HeaderList, encode_half_headers
from outbox.protocol.headers import RESERVED_HEADER_PREFIX, Header

_ORIGIN = Header.ORIGIN_OFFSET.value


def copy_headers(record: HalfRecord, *, check_count: int | None = None) -> HeaderList:
    """The headers of a put-back copy of ``record``: its own, with the origin offset set, in its
    own schema version (a reader not yet upgraded must not meet a newer copy of an older record).

    ``check_count``: write this check count instead of the record's (``resume`` starts over).
    """
    if check_count is None or check_count == record.check_count:
        headers = [(n, v) for n, v in record.raw_headers if n != _ORIGIN]
    else:
        # Ours re-encoded, in place: every other header (the user's, repeats included, and
        # any outbox-* header this version does not know) is carried over as it was.
        fresh = {
            n: v
            for n, v in encode_half_headers(
                txn_id=record.txn_id,
                producer_group=record.producer_group,
                message=record.message,
                index=record.index,
                count=record.count,
                created_at_ms=record.created_at_ms,
                check_count=check_count,
                check_immunity_s=record.check_immunity_s,
                schema_version=record.schema_version,
                check_by=record.check_by,
            )
            if n.startswith(RESERVED_HEADER_PREFIX)
        }
        headers = [
            (n, fresh.pop(n, v) if n.startswith(RESERVED_HEADER_PREFIX) else v)
            for n, v in record.raw_headers
            if n != _ORIGIN
        ]
        headers += fresh.items()  # a field the original lacked (none today)
    headers.append((_ORIGIN, str(record.original_offset).encode()))
    return headers

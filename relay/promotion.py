"""How a half record becomes a record on its real topic, and a bad record a dead letter."""

from __future__ import annotations

from typing import NamedTuple

from outbox.protocol.dead_letter import dead_letter_headers
from outbox.protocol.half import HalfRecord
from outbox.protocol.headers import Header

Headers = list[tuple[str, str | bytes | None]]


class Outgoing(NamedTuple):
    """A record to produce (a tuple: built once per promoted record, where a frozen dataclass's
    ``__init__`` cost three times as much)."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers
    partition: int | None = None


# Plain strings: one promotion per record is the relay's hot path (an enum's .value is a
# descriptor call).
_TXN = Header.TXN_ID.value
_GROUP = Header.PRODUCER_GROUP.value
_INDEX = Header.MESSAGE_INDEX.value


def promoted(record: HalfRecord) -> Outgoing:
    """The original key, value and headers, plus the transaction's coordinates."""
    message = record.message
    headers: Headers = [
        *message.headers,
        (_TXN, record.txn_id.encode()),
        (_GROUP, record.producer_group.encode()),
        (_INDEX, str(record.index).encode()),
    ]
    return Outgoing(message.topic, message.key, message.value, headers)


#: Pre-encoded parts of the promoted headers: message indexes below 64, and producer groups
#: (a handful per relay; bounded below in case a stream names many).
_INDEXES = [(_INDEX, str(i).encode()) for i in range(64)]
_GROUPS: dict[str, tuple[str, bytes]] = {}


def promoted_headers(record: HalfRecord) -> Headers:
    """:func:`promoted`'s headers built from pre-encoded parts (the relay's fast path; equal
    to ``promoted(record).headers``, which ``tests/relay/test_promotion.py`` checks)."""
    group = _GROUPS.get(record.producer_group)
    if group is None:
        if len(_GROUPS) > 1000:
            _GROUPS.clear()
        group = _GROUPS[record.producer_group] = (_GROUP, record.producer_group.encode())
    index = record.index
    return [
        *record.message.headers,
        (_TXN, record.txn_id.encode()),
        group,
        _INDEXES[index] if 0 <= index < 64 else (_INDEX, str(index).encode()),
    ]


def dead_letter(
    topic: str,
    *,
    reason: str,
    source_topic: str,
    source_partition: int,
    source_offset: int,
    key: bytes | None,
    value: bytes | None,
    headers: Headers | None,
) -> Outgoing:
    """The original record, whole, with why and where it came from."""
    all_headers: Headers = list(
        dead_letter_headers(
            headers,
            reason=reason,
            source_topic=source_topic,
            source_partition=source_partition,
            source_offset=source_offset,
        )
    )
    return Outgoing(topic, key, value, all_headers, partition=source_partition)

"""How a half record becomes a record on its real topic, and a bad record a dead letter."""

from __future__ import annotations

from dataclasses import dataclass

from outbox.protocol.dead_letter import dead_letter_headers
from outbox.protocol.half import HalfRecord
from outbox.protocol.headers import Header

Headers = list[tuple[str, str | bytes | None]]


@dataclass(frozen=True)
class Outgoing:
    """A record to produce."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers
    partition: int | None = None


def promoted(record: HalfRecord) -> Outgoing:
    """The original key, value and headers, plus the transaction's coordinates."""
    headers: Headers = list(record.message.headers)
    headers += [
        (Header.TXN_ID.value, record.txn_id.encode()),
        (Header.PRODUCER_GROUP.value, record.producer_group.encode()),
        (Header.MESSAGE_INDEX.value, str(record.index).encode()),
    ]
    return Outgoing(record.message.topic, record.message.key, record.message.value, headers)


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

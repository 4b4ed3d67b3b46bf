"""How large a half record can be, as librdkafka counts it against ``message.max.bytes``.

A message's value is checked against ``max_message_bytes`` when it is built, but librdkafka
refuses a record whose key, value and headers together pass its own ``message.max.bytes``
(1,000,000 by default): the half record adds the transaction id as its key and the outbox's
headers (the real topic, the real key, the producer group, numbers). Left to librdkafka, such
a send failed as a :class:`~outbox.errors.HalfSendError` that broke the transaction; the
producer now refuses it before anything of the send leaves, naming the sizes
(:class:`~outbox.errors.MessageTooLargeError`).

The promoted record is smaller than its half record (one copy of the key, no real-topic or
numbers header), so a half record that fits is promoted by a relay with the same limit.
"""

from __future__ import annotations

from collections.abc import Sequence

from outbox.errors import MessageTooLargeError
from outbox.protocol.half import HalfMessage, encode_half_headers

#: What librdkafka adds to a record's key, value and headers when it checks ``message.max.bytes``
#: (``RD_KAFKAP_MESSAGE_V2_MAX_OVERHEAD``: the record's length, attributes, timestamp and
#: offset deltas and key, value and header-count lengths, each varint at its longest).
RECORD_FRAMING_BYTES = 36
#: What a header costs beyond its name and value: their two length varints at their longest.
HEADER_FRAMING_BYTES = 10
#: Room that covers the outbox's part of any half record (:func:`half_record_bytes` minus the
#: user's value, key and headers, the producer group and the topic): a record whose other
#: parts leave this much room fits without the exact count.
OUTBOX_PART_BYTES = 1024

_LONGEST_ID = "0" * 36  # a transaction id is a UUID's 36 characters
_LONGEST_NUMBER = 2**63 - 1  # index, count, times: none is longer than a 63-bit integer


def user_part_bytes(message: HalfMessage) -> int:
    """What the user's value, key and headers cost in the half record."""
    size = len(message.value or b"") + len(message.key or b"")
    for name, value in message.headers:
        size += HEADER_FRAMING_BYTES + len(name.encode()) + len(value)
    return size


def half_record_bytes(
    message: HalfMessage, *, producer_group: str, schema_version: int, check_by: str
) -> int:
    """The most bytes librdkafka counts for ``message``'s half record: its key (the
    transaction id), value and headers with every number at its longest, and the framing."""
    headers = encode_half_headers(
        txn_id=_LONGEST_ID,
        producer_group=producer_group,
        message=message,
        index=_LONGEST_NUMBER,
        count=_LONGEST_NUMBER,
        created_at_ms=_LONGEST_NUMBER,
        check_count=_LONGEST_NUMBER,
        check_immunity_s=_LONGEST_NUMBER,
        schema_version=schema_version,
        check_by=check_by,
    )
    size = RECORD_FRAMING_BYTES + len(_LONGEST_ID) + len(message.value or b"")
    for name, value in headers:
        size += HEADER_FRAMING_BYTES + len(name.encode()) + len(value)
    return size


def refuse_oversized(
    messages: Sequence[HalfMessage],
    *,
    limit: int,
    producer_group: str,
    schema_version: int,
    check_by: str,
) -> None:
    """Refuse a send whose half record would pass ``limit`` (librdkafka's
    ``message.max.bytes``) before anything of it is sent: librdkafka would refuse that record
    alone, after the others of its batch were handed over.

    Raises:
        MessageTooLargeError: naming the message's topic, its sizes and the fix.
    """
    group = len(producer_group.encode())
    for message in messages:
        user = user_part_bytes(message)
        if user + group + len(message.topic.encode()) + OUTBOX_PART_BYTES <= limit:
            continue
        size = half_record_bytes(
            message,
            producer_group=producer_group,
            schema_version=schema_version,
            check_by=check_by,
        )
        if size > limit:
            raise MessageTooLargeError(
                f"a message for topic {message.topic!r} would make a half record of up to "
                f"{size} bytes (its value, key and headers: {user}; the transaction id and the "
                f"outbox's headers: the rest), over librdkafka's message.max.bytes of {limit}. "
                "Nothing of this send was sent. Send less, or raise message.max.bytes in the "
                "producer's `kafka` settings, the relay's, and the half and real topics' "
                "max.message.bytes"
            )

"""Header names of half records and promoted records, and the schema version."""

from __future__ import annotations

from enum import StrEnum

#: Version of the half-record headers and of the op-record document this code writes and reads.
SCHEMA_VERSION = 1

#: Users may not send headers whose names start with this: they would be mistaken for ours.
RESERVED_HEADER_PREFIX = "outbox-"


class Header(StrEnum):
    """Every header the outbox writes."""

    SCHEMA_VERSION = "outbox-schema-version"
    TXN_ID = "outbox-txn-id"
    PRODUCER_GROUP = "outbox-producer-group"
    REAL_TOPIC = "outbox-real-topic"
    #: Absent when the message has no key (a null key is not the empty key).
    REAL_KEY = "outbox-real-key"
    MESSAGE_INDEX = "outbox-message-index"
    #: Present when the message count was known when the half was sent; the op's count rules.
    MESSAGE_COUNT = "outbox-message-count"
    #: Producer wall clock, Unix ms: informational only, never used for check timing.
    CREATED_AT = "outbox-created-at"
    CHECK_COUNT = "outbox-check-count"
    #: RocketMQ's CHECK_IMMUNITY_TIME_IN_SECONDS: delay this transaction's first check.
    CHECK_IMMUNITY_S = "outbox-check-immunity-s"
    #: Only on a put-back copy (re-appended by the relay, or by ``resume``): the offset of the
    #: original half record in the same partition. Readers identify a message by
    #: (transaction id, message index), never by the offset of a copy.
    ORIGIN_OFFSET = "outbox-origin-offset"


#: Headers every half record carries (besides the optional ones and the user's own).
HALF_HEADERS = (
    Header.SCHEMA_VERSION,
    Header.TXN_ID,
    Header.PRODUCER_GROUP,
    Header.REAL_TOPIC,
    Header.MESSAGE_INDEX,
    Header.CREATED_AT,
    Header.CHECK_COUNT,
)

#: Headers the relay adds to a promoted record on the real topic.
PROMOTED_HEADERS = (Header.TXN_ID, Header.PRODUCER_GROUP, Header.MESSAGE_INDEX)

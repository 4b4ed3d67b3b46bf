"""Header names of half records and promoted records, and the schema versions."""

from __future__ import annotations

from enum import StrEnum

#: Version of the op-record and registry documents this code writes and reads.
SCHEMA_VERSION = 1

#: Version of the half-record headers this code writes by default. Version 2 packs the fields
#: every half record carries into one header, ``outbox-half``: reading nine headers of a record
#: through confluent-kafka and parsing them was the largest single cost of the relay's thread,
#: and one header cut the relay's CPU per promotion by some 7% (docs/benchmarks.md).
HALF_SCHEMA_VERSION = 2
#: The half-record versions this code reads: records written before an upgrade stay readable.
HALF_SCHEMA_VERSIONS = (1, 2)
#: Separates the fields of ``outbox-half`` (ASCII's unit separator, which no topic name, no
#: transaction id and no producer group may contain); integers are decimal ASCII, an absent
#: optional field is empty.
FIELD_SEPARATOR = b"\x1f"

#: Users may not send headers whose names start with this: they would be mistaken for ours.
RESERVED_HEADER_PREFIX = "outbox-"


class Header(StrEnum):
    """Every header the outbox writes."""

    #: Schema version 2: the packed fields of :data:`HALF_FIELDS`, in that order.
    HALF = "outbox-half"
    #: Schema version 1 (and on promoted records): one header per field.
    SCHEMA_VERSION = "outbox-schema-version"
    TXN_ID = "outbox-txn-id"
    PRODUCER_GROUP = "outbox-producer-group"
    REAL_TOPIC = "outbox-real-topic"
    #: Absent when the message has no key (a null key is not the empty key). Its own header in
    #: both versions: a key is any bytes, so it cannot share a header with separated fields.
    REAL_KEY = "outbox-real-key"
    MESSAGE_INDEX = "outbox-message-index"
    #: Present when the message count was known when the half was sent; the op's count rules.
    MESSAGE_COUNT = "outbox-message-count"
    #: Producer wall clock, Unix ms: informational only, never used for check timing.
    CREATED_AT = "outbox-created-at"
    CHECK_COUNT = "outbox-check-count"
    #: RocketMQ's CHECK_IMMUNITY_TIME_IN_SECONDS: delay this transaction's first check.
    CHECK_IMMUNITY_S = "outbox-check-immunity-s"
    #: Present when something other than the evidence row answers this transaction's checks
    #: (:class:`~outbox.protocol.states.CheckBy`; ``listener`` for ``TransactionalProducer``).
    #: Its own header in both versions; a copy carries it over with the others.
    CHECK_BY = "outbox-check-by"
    #: Only on a put-back copy (re-appended by the relay, or by ``resume``): the offset of the
    #: original half record in the same partition. Readers identify a message by
    #: (transaction id, message index), never by the offset of a copy. Its own header in both
    #: versions, so a copy is its original's headers plus this one.
    ORIGIN_OFFSET = "outbox-origin-offset"


#: The fields of ``outbox-half`` (schema version 2), in order; the last two may be empty.
HALF_FIELDS = (
    "schema_version",
    "txn_id",
    "producer_group",
    "real_topic",
    "message_index",
    "created_at_ms",
    "check_count",
    "message_count",
    "check_immunity_s",
)

#: Headers every half record of schema version 1 carries (besides the optional ones and the
#: user's own).
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

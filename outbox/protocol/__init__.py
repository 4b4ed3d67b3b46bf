"""The record contract shared by producer, relay, checker and audit (docs/protocol.md).

Everything a service needs to read or write the internal topics lives here and nowhere else:
header names, states, the half and op record formats, topic names and settings, partitioning.
"""

from __future__ import annotations

from outbox.protocol.completeness import why_incomplete
from outbox.protocol.half import (
    HalfMessage,
    HalfRecord,
    decode_half,
    encode_half_headers,
)
from outbox.protocol.headers import (
    HALF_FIELDS,
    HALF_HEADERS,
    HALF_SCHEMA_VERSION,
    HALF_SCHEMA_VERSIONS,
    PROMOTED_HEADERS,
    RESERVED_HEADER_PREFIX,
    SCHEMA_VERSION,
    Header,
)
from outbox.protocol.ids import new_transaction_id, validate_transaction_id
from outbox.protocol.op import OpRecord, decode_op, encode_op
from outbox.protocol.partitioning import partition_for
from outbox.protocol.states import CheckBy, DecidedBy, LocalTransactionState, OpState
from outbox.protocol.topics import TopicNames, topic_settings

__all__ = [
    "HALF_FIELDS",
    "HALF_HEADERS",
    "HALF_SCHEMA_VERSION",
    "HALF_SCHEMA_VERSIONS",
    "PROMOTED_HEADERS",
    "RESERVED_HEADER_PREFIX",
    "SCHEMA_VERSION",
    "CheckBy",
    "DecidedBy",
    "HalfMessage",
    "HalfRecord",
    "Header",
    "LocalTransactionState",
    "OpRecord",
    "OpState",
    "TopicNames",
    "decode_half",
    "decode_op",
    "encode_half_headers",
    "encode_op",
    "new_transaction_id",
    "partition_for",
    "topic_settings",
    "validate_transaction_id",
    "why_incomplete",
]

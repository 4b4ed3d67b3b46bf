"""Op records: the decision for one transaction, on the compacted op topic.

Key = the transaction id (compaction keeps the latest op per transaction). Value = a JSON document
with a schema version, the state, where the half records are, who decided and when. It goes to the
same partition number as the transaction's half records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from outbox.errors import ProtocolError, UnknownSchemaVersionError, quoted
from outbox.protocol.frozen import frozen
from outbox.protocol.headers import SCHEMA_VERSION
from outbox.protocol.ids import validate_transaction_id
from outbox.protocol.states import DecidedBy, OpState

#: The most one offset costs in an op record: 19 digits (Kafka's offsets are 63-bit) and a comma.
OFFSET_BYTES = 20
#: Room for the rest of an op record: its other fields (a producer group of up to 249
#: characters, the checker's reason), its key and Kafka's record and batch framing.
OP_FIXED_BYTES = 8192
#: The op topic's ``max.message.bytes`` when the broker's default is left alone (the outbox
#: creates its topics without one); librdkafka's own ``message.max.bytes`` is 1,000,000.
BROKER_MAX_MESSAGE_BYTES = 1_048_588
CLIENT_MAX_MESSAGE_BYTES = 1_000_000


def max_half_offsets(op_bytes: int) -> int:
    """How many half records one op record can name and still fit in ``op_bytes``.

    An op names every half record of its transaction by offset, so a transaction with more
    messages than this could commit and never get its decision written: its op, the
    producer's or the checker's, would be refused as too large for ever, and its messages
    never delivered. The producer refuses the send that would pass it
    (:class:`~outbox.errors.TransactionTooLargeError`).
    """
    return max(0, (op_bytes - OP_FIXED_BYTES) // OFFSET_BYTES)


@dataclass(frozen=True)
class OpRecord:
    """A decision. ``half_offsets`` lists the half records' offsets in message-index order."""

    txn_id: str
    state: OpState
    producer_group: str
    half_partition: int
    half_offsets: tuple[int, ...]
    decided_by: DecidedBy
    decided_at_ms: int
    reason: str | None = None
    # Where it was read from (not part of the document).
    partition: int = field(default=-1, compare=False)
    offset: int = field(default=-1, compare=False)

    @property
    def message_count(self) -> int:
        return len(self.half_offsets)


def encode_op(op: OpRecord) -> tuple[bytes, bytes]:
    """``(key, value)`` of the op record."""
    document: dict[str, Any] = {
        "v": SCHEMA_VERSION,
        "txn_id": op.txn_id,
        "state": op.state.value,
        "producer_group": op.producer_group,
        "half": {"partition": op.half_partition, "offsets": list(op.half_offsets)},
        "message_count": op.message_count,
        "decided_by": op.decided_by.value,
        "decided_at_ms": op.decided_at_ms,
    }
    if op.reason is not None:
        document["reason"] = op.reason
    # orjson: a seventh of json.dumps's cost; compact, and UTF-8 rather than \u escapes.
    return op.txn_id.encode(), orjson.dumps(document)


# Lookups by value without the enum's call machinery (one op per transaction on the relay's
# hot path); an unknown value is a KeyError, reported like any malformed field.
_STATES = {state.value: state for state in OpState}
_DECIDERS = {decider.value: decider for decider in DecidedBy}


def decode_op(
    key: bytes | None, value: bytes | None, *, partition: int = -1, offset: int = -1
) -> OpRecord | None:
    """Read an op record back; None for a tombstone (a compaction delete marker).

    Raises:
        UnknownSchemaVersionError: the document's ``v`` is not one we know.
        ProtocolError: not JSON, or a field is missing or malformed.
    """
    if value is None:
        return None
    try:
        # orjson parses in a third of the json module's time (the relay reads one op per
        # transaction), and refuses what JSON does not allow: NaN, lone surrogates, bad UTF-8.
        doc = orjson.loads(value)
    except orjson.JSONDecodeError as err:
        raise ProtocolError(f"{_where(partition, offset)} is not a JSON document: {err}") from err
    if not isinstance(doc, dict):
        raise ProtocolError(f"{_where(partition, offset)} is not a JSON object")
    if doc.get("v") != SCHEMA_VERSION:
        raise UnknownSchemaVersionError(
            f"{_where(partition, offset)} has schema version {quoted(doc.get('v'))}; this "
            f"code reads version {SCHEMA_VERSION} only - upgrade the reader"
        )
    try:
        half = doc["half"]
        half_partition, offsets, decided_at_ms = (
            half["partition"],
            half["offsets"],
            doc["decided_at_ms"],
        )
        reason = doc.get("reason")
        # Numbers are JSON integers, as Spark's audit reads them: int() would take "3" and
        # truncate 3.7, and orjson reads an integer past 64 bits as a float.
        if not (
            type(half_partition) is int
            and type(decided_at_ms) is int
            and type(offsets) is list
            and half_partition >= 0
            and (reason is None or type(reason) is str)
        ):
            raise TypeError(_not_numbers(half_partition, offsets, decided_at_ms, reason))
        for half_offset in offsets:
            if type(half_offset) is not int or half_offset < 0:
                shown = quoted(half_offset)
                raise TypeError(f"half.offsets holds {shown}: offsets are integers >= 0")
        op: OpRecord = frozen(
            OpRecord,
            {
                "txn_id": validate_transaction_id(doc["txn_id"]),
                "state": _STATES[doc["state"]],
                "producer_group": str(doc["producer_group"]),
                "half_partition": half_partition,
                "half_offsets": tuple(offsets),
                "decided_by": _DECIDERS[doc["decided_by"]],
                "decided_at_ms": decided_at_ms,
                "reason": reason,
                "partition": partition,
                "offset": offset,
            },
        )
    except (KeyError, TypeError, ValueError) as err:
        where = _where(partition, offset)
        shown = quoted(err, 200)
        raise ProtocolError(f"{where} has a missing or malformed field: {shown}") from err
    if key is not None and key != op.txn_id.encode():
        where = _where(partition, offset)
        raise ProtocolError(f"{where}: key {quoted(key)} differs from its txn_id {op.txn_id!r}")
    return op


def _not_numbers(
    half_partition: object, offsets: object, decided_at_ms: object, reason: object
) -> str:
    """Which of the checked fields is wrong (formatted only once one is)."""
    if type(half_partition) is not int or half_partition < 0:
        return f"half.partition is {quoted(half_partition)}: a partition is an integer >= 0"
    if type(offsets) is not list:
        return f"half.offsets is {quoted(offsets)}: a list of integers"
    if type(decided_at_ms) is not int:
        return f"decided_at_ms is {quoted(decided_at_ms)}: Unix milliseconds, an integer"
    return f"reason is {quoted(reason)}: a string, or left out"


def _where(partition: int, offset: int) -> str:
    """How errors name an op record (formatted only once something is wrong)."""
    return f"op record at partition {partition} offset {offset}"

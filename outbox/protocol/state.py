"""State records: what a relay or checker must remember about a pending transaction across
restarts and rebalances, on the compacted state topic (``{prefix}-state``).

Offset-commit metadata is bounded (the broker's ``offset.metadata.max.bytes``, 4096 by
default), so nothing whose size grows with traffic may live there. A service writes one record
per transaction it must remember, in the same Kafka transaction as the progress that makes it
true, and a tombstone once it need not; compaction keeps the latest per key, so the topic holds
what is pending now. A restarted service reads its partition of the topic back.

- key: ``{service}/{group}/{txn_id}`` (UTF-8): the service (``relay`` or ``checker``), its
  consumer group (another group on the same topics keeps its own records), the transaction id.
- partition: the transaction's half partition number.
- value: a JSON document ``{"v": 1, ...}`` (below), or null (a tombstone: forget it).

- ``relay``: ``{"v": 1, "parked": {<op document>}}``: a COMMIT handled but not yet written
  (its real topic is missing or refused it); the op as on the op topic.
- ``checker``: ``{"v": 1, "checks": 3, "unreachable_since_ms": null}``: checks its producers
  answered UNKNOWN, and since when none answered (the checker's clock).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from outbox.errors import ProtocolError, UnknownSchemaVersionError, quoted
from outbox.protocol.ids import validate_transaction_id
from outbox.protocol.op import OpRecord, decode_op, encode_op

#: Version of the state documents this code writes and reads.
STATE_VERSION = 1


class StateOwner(StrEnum):
    """Which service a state record belongs to."""

    RELAY = "relay"
    CHECKER = "checker"


@dataclass(frozen=True)
class StateKey:
    owner: StateOwner
    group: str
    txn_id: str

    def encode(self) -> bytes:
        return f"{self.owner.value}/{self.group}/{self.txn_id}".encode()


@dataclass(frozen=True)
class Parked:
    """A relay's parked COMMIT."""

    op: OpRecord


@dataclass(frozen=True)
class CheckCount:
    """A checker's record of a transaction it keeps asking about."""

    checks: int
    unreachable_since_ms: int | None = None


StateValue = Parked | CheckCount


def encode_state(key: StateKey, value: StateValue | None) -> tuple[bytes, bytes | None]:
    """``(key, value)`` of a state record; ``value`` None writes a tombstone."""
    if value is None:
        return key.encode(), None
    document: dict[str, Any] = {"v": STATE_VERSION}
    if isinstance(value, Parked):
        document["parked"] = orjson.loads(encode_op(value.op)[1])
    else:
        document["checks"] = value.checks
        document["unreachable_since_ms"] = value.unreachable_since_ms
    return key.encode(), orjson.dumps(document)


def decode_state_key(key: bytes | None) -> StateKey:
    """Raises ProtocolError: not ``{relay|checker}/{group}/{txn_id}``."""
    try:
        text = (key or b"").decode()
    except UnicodeDecodeError as err:
        raise ProtocolError(f"state key {quoted(key)} is not UTF-8") from err
    owner, _, rest = text.partition("/")
    group, _, txn_id = rest.rpartition("/")
    try:
        return StateKey(StateOwner(owner), group, validate_transaction_id(txn_id))
    except ValueError as err:
        raise ProtocolError(f"state key {quoted(text)} is not service/group/txn_id") from err


def decode_state(
    key: bytes | None, value: bytes | None, *, partition: int = -1
) -> tuple[StateKey, StateValue | None]:
    """A state record read back; its value None for a tombstone.

    Raises:
        ProtocolError: a malformed key or document.
        UnknownSchemaVersionError: a document of a version this code does not know.
    """
    state_key = decode_state_key(key)
    if value is None:
        return state_key, None
    try:
        document = orjson.loads(value)
    except orjson.JSONDecodeError as err:
        raise ProtocolError(f"state record {quoted(key)} is not JSON: {err}") from err
    if not isinstance(document, dict):
        raise ProtocolError(f"state record {quoted(key)} is not a JSON object")
    if document.get("v") != STATE_VERSION:
        raise UnknownSchemaVersionError(
            f"state record {quoted(key)} has version {quoted(document.get('v'))}; this code "
            f"reads version {STATE_VERSION}"
        )
    if "parked" in document:
        op = decode_op(
            state_key.txn_id.encode(), orjson.dumps(document["parked"]), partition=partition
        )
        if op is None or op.txn_id != state_key.txn_id:
            raise ProtocolError(f"state record {quoted(key)} parks another transaction's op")
        return state_key, Parked(op)
    checks, since = document.get("checks"), document.get("unreachable_since_ms")
    if type(checks) is not int or checks < 0 or not (since is None or type(since) is int):
        raise ProtocolError(f"state record {quoted(key)}: checks or unreachable_since_ms malformed")
    return state_key, CheckCount(checks, since)

"""Half records: a message parked on the half topic until its transaction is decided.

Key = the transaction id. Value = the message value, untouched. Headers = the user's headers plus
the ``outbox-*`` headers of :mod:`outbox.protocol.headers`, which say where the message really
goes and to which transaction it belongs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from outbox.errors import ProtocolError, UnknownSchemaVersionError
from outbox.protocol.frozen import frozen
from outbox.protocol.headers import HALF_HEADERS, RESERVED_HEADER_PREFIX, SCHEMA_VERSION, Header
from outbox.protocol.ids import validate_transaction_id

HeaderList = list[tuple[str, bytes]]


@dataclass(frozen=True)
class HalfMessage:
    """One message of a transaction, serialized and validated, not yet sent."""

    topic: str
    value: bytes | None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True)
class HalfRecord:
    """A half record as read back from the half topic."""

    txn_id: str
    producer_group: str
    message: HalfMessage
    index: int
    count: int | None
    created_at_ms: int
    check_count: int
    check_immunity_s: int | None = None
    #: Set on a put-back copy: the offset of the original half record.
    origin_offset: int | None = None
    # Where it was read from; the broker's timestamp (LogAppendTime on the half topic).
    partition: int = -1
    offset: int = -1
    timestamp_ms: int = -1
    raw_headers: tuple[tuple[str, bytes], ...] = field(default=(), repr=False)

    @property
    def original_offset(self) -> int:
        """The offset the producer's record has: op records name these, never a copy's."""
        return self.offset if self.origin_offset is None else self.origin_offset

    @property
    def is_copy(self) -> bool:
        return self.origin_offset is not None


def encode_half_headers(
    *,
    txn_id: str,
    producer_group: str,
    message: HalfMessage,
    index: int,
    count: int | None,
    created_at_ms: int,
    check_count: int = 0,
    check_immunity_s: int | None = None,
) -> HeaderList:
    """The headers of one half record: the user's first, ours after."""
    headers: HeaderList = list(message.headers)
    headers += [
        (Header.SCHEMA_VERSION.value, str(SCHEMA_VERSION).encode()),
        (Header.TXN_ID.value, txn_id.encode()),
        (Header.PRODUCER_GROUP.value, producer_group.encode()),
        (Header.REAL_TOPIC.value, message.topic.encode()),
        (Header.MESSAGE_INDEX.value, str(index).encode()),
        (Header.CREATED_AT.value, str(created_at_ms).encode()),
        (Header.CHECK_COUNT.value, str(check_count).encode()),
    ]
    if message.key is not None:
        headers.append((Header.REAL_KEY.value, message.key))
    if count is not None:
        headers.append((Header.MESSAGE_COUNT.value, str(count).encode()))
    if check_immunity_s is not None:
        headers.append((Header.CHECK_IMMUNITY_S.value, str(check_immunity_s).encode()))
    return headers


# Plain strings: an enum member's ``.value`` costs a descriptor call, and this is the relay's
# hottest path (one call per half record read).
_SCHEMA = Header.SCHEMA_VERSION.value
_TXN = Header.TXN_ID.value
_GROUP = Header.PRODUCER_GROUP.value
_TOPIC = Header.REAL_TOPIC.value
_KEY = Header.REAL_KEY.value
_INDEX = Header.MESSAGE_INDEX.value
_COUNT = Header.MESSAGE_COUNT.value
_CREATED = Header.CREATED_AT.value
_CHECKS = Header.CHECK_COUNT.value
_IMMUNITY = Header.CHECK_IMMUNITY_S.value
_ORIGIN = Header.ORIGIN_OFFSET.value
_VERSION = str(SCHEMA_VERSION).encode()


def decode_half(
    *,
    value: bytes | None,
    headers: Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None] | None,
    partition: int = -1,
    offset: int = -1,
    timestamp_ms: int = -1,
) -> HalfRecord:
    """Read a half record back.

    Raises:
        UnknownSchemaVersionError: the schema version header is missing or not one we know.
        ProtocolError: a required header is missing or malformed.
    """
    ours: dict[str, bytes] = {}
    user: list[tuple[str, bytes]] = []
    if type(headers) is list:  # what confluent-kafka hands out
        pairs: Sequence[tuple[str, str | bytes | None]] = headers
    elif isinstance(headers, Mapping):
        pairs = list(headers.items())
    else:
        pairs = headers or []
    normalized = pairs
    for name, data in pairs:  # one pass; the rare non-bytes value sends it to the slow path
        if type(data) is not bytes:
            normalized = [
                (n, v if type(v) is bytes else (v.encode() if isinstance(v, str) else b""))
                for n, v in pairs
            ]
            ours.clear()
            user.clear()
            for n, v in normalized:
                if n.startswith(RESERVED_HEADER_PREFIX):
                    ours[n] = v  # type: ignore[assignment]
                else:
                    user.append((n, v))  # type: ignore[arg-type]
            break
        if name.startswith(RESERVED_HEADER_PREFIX):
            ours[name] = data
        else:
            user.append((name, data))
    version = ours.get(_SCHEMA)
    if version != _VERSION:
        raise UnknownSchemaVersionError(
            f"half record at partition {partition} offset {offset} has schema version "
            f"{version!r}; this code reads version {SCHEMA_VERSION} only - upgrade the reader"
        )
    try:
        return frozen(
            HalfRecord,
            {
                "txn_id": validate_transaction_id(ours[_TXN].decode()),
                "producer_group": ours[_GROUP].decode(),
                "message": frozen(
                    HalfMessage,
                    {
                        "topic": ours[_TOPIC].decode(),
                        "value": value,
                        "key": ours.get(_KEY),
                        "headers": tuple(user),
                    },
                ),
                "index": int(ours[_INDEX]),
                "count": int(ours[_COUNT]) if _COUNT in ours else None,
                "created_at_ms": int(ours[_CREATED]),
                "check_count": int(ours[_CHECKS]),
                "check_immunity_s": int(ours[_IMMUNITY]) if _IMMUNITY in ours else None,
                "origin_offset": int(ours[_ORIGIN]) if _ORIGIN in ours else None,
                "partition": partition,
                "offset": offset,
                "timestamp_ms": timestamp_ms,
                "raw_headers": tuple(normalized),
            },
        )
    except (KeyError, UnicodeDecodeError, ValueError) as err:
        # The fast path failed: name exactly what is wrong.
        where = f"half record at partition {partition} offset {offset}"
        for header in HALF_HEADERS:
            _text(ours, header, where)
        for header in (*HALF_HEADERS, Header.MESSAGE_COUNT, Header.CHECK_IMMUNITY_S):
            if header.value in ours and header not in (
                Header.SCHEMA_VERSION,
                Header.TXN_ID,
                Header.PRODUCER_GROUP,
                Header.REAL_TOPIC,
            ):
                _int(ours, header, where)
        raise ProtocolError(f"{where}: {err}") from err


def copy_headers(record: HalfRecord) -> HeaderList:
    """The headers of a put-back copy of ``record``: its own, with the origin offset set."""
    headers = [(n, v) for n, v in record.raw_headers if n != Header.ORIGIN_OFFSET.value]
    headers.append((Header.ORIGIN_OFFSET.value, str(record.original_offset).encode()))
    return headers


def _text(headers: dict[str, bytes], name: Header, where: str) -> str:
    raw = headers.get(name.value)
    if raw is None:
        raise ProtocolError(f"{where} lacks the {name.value} header")
    try:
        return raw.decode()
    except UnicodeDecodeError as err:
        raise ProtocolError(f"{where}: header {name.value} is not UTF-8") from err


def _int(headers: dict[str, bytes], name: Header, where: str) -> int:
    text = _text(headers, name, where)
    try:
        return int(text)
    except ValueError as err:
        raise ProtocolError(f"{where}: header {name.value}={text!r} is not an integer") from err

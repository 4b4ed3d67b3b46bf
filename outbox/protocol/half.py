"""Half records: a message parked on the half topic until its transaction is decided.

Key = the transaction id. Value = the message value, untouched. Headers = the user's headers plus
the ``outbox-*`` headers of :mod:`outbox.protocol.headers`, which say where the message really
goes and to which transaction it belongs.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field

from outbox.errors import InvalidMessageError, ProtocolError, UnknownSchemaVersionError
from outbox.protocol.frozen import frozen
from outbox.protocol.headers import (
    FIELD_SEPARATOR,
    HALF_FIELDS,
    HALF_SCHEMA_VERSION,
    HALF_SCHEMA_VERSIONS,
    RESERVED_HEADER_PREFIX,
    Header,
)
from outbox.protocol.ids import validate_transaction_id
from outbox.protocol.malformed import (
    diagnose_packed,
    diagnose_v1,
    header_int,
    refuse_packed,
    refuse_v1,
    where_is,
)
from outbox.protocol.states import CheckBy

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
    #: What answers checks of its transaction (header ``outbox-check-by``; absent: evidence).
    #: A :class:`CheckBy` value, or as written when a newer producer wrote one this code does
    #: not know (the relay need not know it; a check endpoint answers UNKNOWN for it).
    check_by: str = CheckBy.EVIDENCE
    #: The version its headers were written in; a copy is written in the same one.
    schema_version: int = HALF_SCHEMA_VERSION
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


# Plain strings: an enum member's ``.value`` costs a descriptor call, and this is the relay's
# hottest path (one call per half record read).
_HALF = Header.HALF.value
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
_CHECK_BY = Header.CHECK_BY.value
_CHECK_BY_VALUES: dict[bytes, str] = {c.value.encode(): c for c in CheckBy}
_V1 = b"1"
_V2 = b"2"
_SEP = FIELD_SEPARATOR


#: The longest immunity a half record's header is sized for (:mod:`outbox.protocol.record_size`).
MOST_IMMUNITY_S = 2**63 - 1


def check_immunity(check_immunity_s: object) -> int | None:
    """``check_immunity_s`` as the half records carry it: whole seconds, 0 to 2**63 - 1.

    The relay and the checker read the field as an integer, so a record carrying ``60.0`` (a
    ``timedelta``'s ``total_seconds()``) or ``True`` would be undecodable: dead-lettered by the
    relay after the local transaction committed, its message never delivered.

    Raises:
        InvalidMessageError: anything else, named, with the fix.
    """
    if check_immunity_s is None:
        return None
    whole: int | None = None
    if not isinstance(check_immunity_s, bool) and type(check_immunity_s).__name__ != "bool_":
        with suppress(TypeError):
            whole = operator.index(check_immunity_s)  # type: ignore[arg-type]  # int, IntEnum, numpy ints
    if whole is not None and 0 <= whole <= MOST_IMMUNITY_S:
        return whole
    raise InvalidMessageError(
        f"check_immunity_s must be a whole number of seconds from 0 to 2**63 - 1, got "
        f"{type(check_immunity_s).__name__} {check_immunity_s!r:.40}; pass an int, e.g. "
        "int(timedelta(minutes=1).total_seconds())"
    )


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
    schema_version: int = HALF_SCHEMA_VERSION,
    check_by: str = CheckBy.EVIDENCE,
) -> HeaderList:
    """The headers of one half record: the user's first, ours after.

    Raises:
        UnknownSchemaVersionError: ``schema_version`` is not one of :data:`HALF_SCHEMA_VERSIONS`.
        ProtocolError: the producer group contains the field separator (a control character).
    """
    headers: HeaderList = list(message.headers)
    if schema_version == 2:
        group = producer_group.encode()
        if _SEP in group:
            raise ProtocolError(
                f"producer group {producer_group!r} contains a control character (\\x1f); "
                "name the group with printable characters"
            )
        headers.append(
            (
                _HALF,
                _SEP.join(
                    (
                        _V2,
                        txn_id.encode(),
                        group,
                        message.topic.encode(),
                        str(index).encode(),
                        str(created_at_ms).encode(),
                        str(check_count).encode(),
                        b"" if count is None else str(count).encode(),
                        b"" if check_immunity_s is None else str(check_immunity_s).encode(),
                    )
                ),
            )
        )
        if message.key is not None:
            headers.append((_KEY, message.key))
        if check_by != CheckBy.EVIDENCE:
            headers.append((_CHECK_BY, check_by.encode()))
        return headers
    if schema_version != 1:
        raise UnknownSchemaVersionError(
            f"half schema version {schema_version!r} is not one this code writes; "
            f"use one of {', '.join(map(str, HALF_SCHEMA_VERSIONS))}"
        )
    headers += [
        (_SCHEMA, _V1),
        (_TXN, txn_id.encode()),
        (_GROUP, producer_group.encode()),
        (_TOPIC, message.topic.encode()),
        (_INDEX, str(index).encode()),
        (_CREATED, str(created_at_ms).encode()),
        (_CHECKS, str(check_count).encode()),
    ]
    if message.key is not None:
        headers.append((_KEY, message.key))
    if count is not None:
        headers.append((_COUNT, str(count).encode()))
    if check_immunity_s is not None:
        headers.append((_IMMUNITY, str(check_immunity_s).encode()))
    if check_by != CheckBy.EVIDENCE:
        headers.append((_CHECK_BY, check_by.encode()))
    return headers


def decode_half(
    *,
    value: bytes | None,
    headers: Sequence[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None] | None,
    partition: int = -1,
    offset: int = -1,
    timestamp_ms: int = -1,
) -> HalfRecord:
    """Read a half record back, of any version in :data:`HALF_SCHEMA_VERSIONS`.

    Raises:
        UnknownSchemaVersionError: the record carries neither ``outbox-half`` nor a schema
            version header, or names a version we do not know.
        ProtocolError: a required field is missing or malformed.
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
    packed = ours.get(_HALF)
    if packed is not None:
        fields = packed.split(_SEP)
        if fields[0] != _V2 or len(fields) != len(HALF_FIELDS):
            refuse_packed(fields, where_is(partition, offset))
        _, txn, group, topic, index, created, checks, count, immunity = fields
        # (read as bytes | None below; mypy typed them from this unpacking)
        count, immunity, version = count or None, immunity or None, 2  # type: ignore[assignment]
        if not group or not topic:
            empty = "producer_group" if not group else "real_topic"
            where = where_is(partition, offset)
            raise ProtocolError(f"{where}: {empty} in header {_HALF} is empty")
    else:
        if ours.get(_SCHEMA) != _V1:
            refuse_v1(ours.get(_SCHEMA), where_is(partition, offset))
        get = ours.get
        # a missing header reads as None, which the decoding below refuses
        txn, group, topic, index = get(_TXN), get(_GROUP), get(_TOPIC), get(_INDEX)  # type: ignore[assignment]
        created, checks = get(_CREATED), get(_CHECKS)  # type: ignore[assignment]
        count, immunity = get(_COUNT), get(_IMMUNITY)  # type: ignore[assignment]
        version = 1
    try:
        return frozen(
            HalfRecord,
            {
                "txn_id": validate_transaction_id(txn.decode()),
                "producer_group": group.decode(),
                "message": frozen(
                    HalfMessage,
                    {
                        "topic": topic.decode(),
                        "value": value,
                        "key": ours.get(_KEY),
                        "headers": tuple(user),
                    },
                ),
                "index": int(index),
                "count": None if count is None else int(count),
                "created_at_ms": int(created),
                "check_count": int(checks),
                "check_immunity_s": None if immunity is None else int(immunity),
                "origin_offset": int(ours[_ORIGIN]) if _ORIGIN in ours else None,
                "check_by": _check_by(ours[_CHECK_BY]) if _CHECK_BY in ours else _EVIDENCE,
                "schema_version": version,
                "partition": partition,
                "offset": offset,
                "timestamp_ms": timestamp_ms,
                "raw_headers": tuple(normalized),
            },
        )
    except ProtocolError as err:  # the transaction id's own check: say where
        raise ProtocolError(f"{where_is(partition, offset)}: {err}") from err
    except (AttributeError, TypeError, UnicodeDecodeError, ValueError) as err:
        # The fast path failed (a header missing reads as None): name exactly what is wrong.
        where = where_is(partition, offset)
        if version == 2:
            diagnose_packed(fields, where, err)
        else:
            diagnose_v1(ours, where)
        if _ORIGIN in ours:
            header_int(ours, Header.ORIGIN_OFFSET, where)
        raise ProtocolError(f"{where}: {err}") from err


_EVIDENCE = CheckBy.EVIDENCE


def _check_by(raw: bytes) -> str:
    known = _CHECK_BY_VALUES.get(raw)
    return known if known is not None else raw.decode(errors="replace")

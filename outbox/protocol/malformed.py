"""Why a half record does not read: the errors :func:`outbox.protocol.half.decode_half` raises.

The decoder's fast path reads every field at once and, only when that fails, calls these to
name the first field or header that is wrong (which field, which record, what to do), so a
dead letter's reason or a checker's log says what a person needs to fix it.
"""

from __future__ import annotations

from typing import NoReturn

from outbox.errors import ProtocolError, UnknownSchemaVersionError, quoted
from outbox.protocol.headers import HALF_FIELDS, HALF_HEADERS, Header

_HALF = Header.HALF.value
_SCHEMA = Header.SCHEMA_VERSION.value
_V2 = b"2"


def where_is(partition: int, offset: int) -> str:
    """How errors name a record (formatted only once something is wrong)."""
    return f"half record at partition {partition} offset {offset}"


def refuse_packed(fields: list[bytes], where: str) -> NoReturn:
    """Refuse an ``outbox-half`` header of another version or with the wrong field count."""
    if fields[0] != _V2:
        raise UnknownSchemaVersionError(
            f"{where} has schema version {fields[0][:20]!r} in its {_HALF} header; this "
            "code reads versions 1 and 2 - upgrade the reader"
        )
    raise ProtocolError(
        f"{where}: header {_HALF} has {len(fields)} fields; version 2 has "
        f"{len(HALF_FIELDS)} ({', '.join(HALF_FIELDS)})"
    )


def refuse_v1(version: bytes | None, where: str) -> NoReturn:
    """Refuse a record without ``outbox-half`` whose schema version header is not 1."""
    if version is None:
        raise UnknownSchemaVersionError(
            f"{where} has neither an {_HALF} nor an {_SCHEMA} header: not a half record "
            "of a version this code reads (1 and 2)"
        )
    if version == _V2:
        raise ProtocolError(
            f"{where} has {_SCHEMA}=b'2' but no {_HALF} header: a version-2 record "
            f"carries its fields in {_HALF}, so this one is malformed"
        )
    raise UnknownSchemaVersionError(
        f"{where} has schema version {version[:20]!r}; this code reads versions 1 and 2 "
        "- upgrade the reader"
    )


def diagnose_packed(fields: list[bytes], where: str, err: Exception) -> None:
    """Raise naming the first field of ``outbox-half`` that does not read."""
    for field_name, raw in zip(HALF_FIELDS, fields, strict=True):
        if field_name in _TEXT_FIELDS:
            try:
                raw.decode()
            except UnicodeDecodeError:
                raise ProtocolError(f"{where}: {field_name} is not UTF-8") from err
        elif raw or field_name not in _OPTIONAL_FIELDS:
            try:
                int(raw)
            except ValueError:
                raise ProtocolError(
                    f"{where}: {field_name}={raw[:40]!r} is not a decimal integer"
                ) from err


def diagnose_v1(ours: dict[str, bytes], where: str) -> None:
    """Raise naming the first version-1 header that is missing or does not read."""
    for header in HALF_HEADERS:
        _text(ours, header, where)
    for header in (*HALF_HEADERS, Header.MESSAGE_COUNT, Header.CHECK_IMMUNITY_S):
        if header.value in ours and header not in (
            Header.SCHEMA_VERSION,
            Header.TXN_ID,
            Header.PRODUCER_GROUP,
            Header.REAL_TOPIC,
        ):
            header_int(ours, header, where)


_TEXT_FIELDS = frozenset({"schema_version", "txn_id", "producer_group", "real_topic"})
_OPTIONAL_FIELDS = frozenset({"message_count", "check_immunity_s"})


def _text(headers: dict[str, bytes], name: Header, where: str) -> str:
    raw = headers.get(name.value)
    if raw is None:
        raise ProtocolError(f"{where} lacks the {name.value} header")
    try:
        return raw.decode()
    except UnicodeDecodeError as err:
        raise ProtocolError(f"{where}: header {name.value} is not UTF-8") from err


def header_int(headers: dict[str, bytes], name: Header, where: str) -> int:
    text = _text(headers, name, where)
    try:
        return int(text)
    except ValueError as err:
        shown = quoted(text)
        raise ProtocolError(f"{where}: header {name.value}={shown} is not an integer") from err

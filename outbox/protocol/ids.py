"""Transaction ids: UUIDv7 strings, so ids sort by creation time (handy in logs and audits)."""

from __future__ import annotations

import os
import re
import time
import uuid

from outbox.errors import ProtocolError, quoted


def new_transaction_id() -> str:
    """A fresh UUIDv7 (RFC 9562): 48-bit Unix milliseconds, then 74 random bits."""
    millis = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (millis & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version 7
    value |= ((rand >> 62) & 0xFFF) << 64  # rand_a, 12 bits
    value |= 0b10 << 62  # RFC 4122 variant
    value |= rand & ((1 << 62) - 1)  # rand_b, 62 bits
    # str(uuid.UUID(int=value)) spelled out: a third of its cost, on every transaction
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_CANONICAL = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def validate_transaction_id(value: object) -> str:
    """Return ``value`` as a canonical UUID string or raise naming what is wrong with it.

    Raises:
        ProtocolError: not a string in canonical UUID form.
    """
    if type(value) is str and _CANONICAL.fullmatch(value):
        return value  # the fast path: every id this project writes
    if not isinstance(value, str):
        raise ProtocolError(f"transaction id must be a UUID string, got {type(value).__name__}")
    try:
        parsed = uuid.UUID(value)
    except ValueError as err:
        raise ProtocolError(f"transaction id {quoted(value)} is not a UUID") from err
    if str(parsed) != value:
        raise ProtocolError(
            f"transaction id {quoted(value)} is not in canonical lowercase UUID form"
        )
    return value


def transaction_id_millis(txn_id: str) -> int:
    """The creation time (Unix ms) a UUIDv7 carries."""
    return uuid.UUID(txn_id).int >> 80

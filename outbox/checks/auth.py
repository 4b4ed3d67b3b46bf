"""Signing and verifying check requests: HMAC-SHA256 over method, path, timestamp and body."""

from __future__ import annotations

import hashlib
import hmac
import time

HEADER_TIMESTAMP = "x-outbox-timestamp"
HEADER_SIGNATURE = "x-outbox-signature"


def signature(secret: bytes, method: str, path: str, timestamp: str, body: bytes) -> str:
    message = b"\n".join([method.upper().encode(), path.encode(), timestamp.encode(), body])
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def sign(secret: bytes, method: str, path: str, body: bytes) -> dict[str, str]:
    """The headers a signed request carries."""
    timestamp = str(int(time.time()))
    return {
        HEADER_TIMESTAMP: timestamp,
        HEADER_SIGNATURE: signature(secret, method, path, timestamp, body),
    }


def verify(
    secret: bytes,
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes,
    *,
    max_skew_s: float,
    now: float | None = None,
) -> str | None:
    """None when the request is authentic and fresh, else why not (for a 401)."""
    timestamp = headers.get(HEADER_TIMESTAMP)
    given = headers.get(HEADER_SIGNATURE)
    if not timestamp or not given:
        return f"missing {HEADER_TIMESTAMP} or {HEADER_SIGNATURE} header"
    try:
        sent = int(timestamp)
    except ValueError:
        return f"{HEADER_TIMESTAMP}={timestamp!r} is not Unix seconds"
    if abs((time.time() if now is None else now) - sent) > max_skew_s:
        return f"stale request: timestamp {sent} is more than {max_skew_s:.0f} s from now"
    expected = signature(secret, method, path, timestamp, body)
    if not hmac.compare_digest(expected, given):
        return "wrong signature"
    return None

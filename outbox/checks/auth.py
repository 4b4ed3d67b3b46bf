"""Signing and verifying check requests: HMAC-SHA256 over method, path, timestamp and body.

A request is refused when its signature is wrong (tampered, or another secret), when its
timestamp is more than ``max_skew_s`` from the endpoint's clock (stale), or when the endpoint
has already seen its signature (replayed: the body carries a random nonce, so no two genuine
requests share one). A stale refusal tells the checker the endpoint's time, and the checker
signs with it: the answer never depends on the producer host's clock being right.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

HEADER_TIMESTAMP = "x-outbox-timestamp"
HEADER_SIGNATURE = "x-outbox-signature"


def signature(secret: bytes, method: str, path: str, timestamp: str, body: bytes) -> str:
    message = b"\n".join([method.upper().encode(), path.encode(), timestamp.encode(), body])
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def sign(
    secret: bytes, method: str, path: str, body: bytes, *, now: float | None = None
) -> dict[str, str]:
    """The headers a signed request carries; ``now`` is the time to sign with (the endpoint's
    clock as the checker last learned it), by default this host's."""
    timestamp = str(int(time.time() if now is None else now))
    return {
        HEADER_TIMESTAMP: timestamp,
        HEADER_SIGNATURE: signature(secret, method, path, timestamp, body),
    }


@dataclass(frozen=True)
class Refusal:
    """Why a request was refused (401); ``stale`` when only its timestamp was out of range."""

    reason: str
    stale: bool = False


def verify(
    secrets: Sequence[bytes],
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes,
    *,
    max_skew_s: float,
    now: float | None = None,
    replays: ReplayGuard | None = None,
) -> Refusal | None:
    """None when the request is authentic, fresh and new, else why not.

    The signature is checked before the timestamp, so only a request signed with the secret
    learns that its clock was off. Any of ``secrets`` may have signed it: while a secret is
    rotated the endpoint accepts the new one and the one it replaces, so the checker and the
    producers need not restart at the same moment.
    """
    timestamp = headers.get(HEADER_TIMESTAMP)
    given = headers.get(HEADER_SIGNATURE)
    if not timestamp or not given:
        return Refusal(f"missing {HEADER_TIMESTAMP} or {HEADER_SIGNATURE} header")
    try:
        sent = int(timestamp)
    except ValueError:
        return Refusal(f"{HEADER_TIMESTAMP}={timestamp[:40]!r} is not Unix seconds")
    # Every secret is tried (no early exit): how long the check takes says nothing of which one
    # signed, or how close a forgery came.
    given_bytes = given.encode("utf-8", "replace")  # compare_digest refuses non-ASCII str
    matches = [
        hmac.compare_digest(signature(secret, method, path, timestamp, body).encode(), given_bytes)
        for secret in secrets
    ]
    if not any(matches):
        return Refusal("wrong signature")
    now = time.time() if now is None else now
    if abs(now - sent) > max_skew_s:
        return Refusal(
            f"stale request: timestamp {sent} is more than {max_skew_s:.0f} s from the "
            f"endpoint's clock ({int(now)})",
            stale=True,
        )
    if replays is not None and not replays.first_sight(given, now):
        return Refusal("replayed request: this signature was already used")
    return None


class ReplayGuard:
    """Remembers the signatures accepted within the skew window, refusing a second use.

    A signature older than the window needs no memory (its timestamp is refused as stale), so
    the memory holds at most the requests of one window; past ``capacity`` the oldest go first
    (a genuine checker sends a few requests a second).
    """

    def __init__(self, window_s: float, capacity: int = 100_000) -> None:
        self.window_s = window_s
        self.capacity = capacity
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def first_sight(self, signature: str, now: float) -> bool:
        with self._lock:
            horizon = now - 2 * self.window_s
            while self._seen and (
                next(iter(self._seen.values())) < horizon or len(self._seen) >= self.capacity
            ):
                self._seen.popitem(last=False)
            if signature in self._seen:
                return False
            self._seen[signature] = now
            return True

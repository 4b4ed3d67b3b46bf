"""One check request in, one HTTP status and JSON body out — for every transport.

Order of refusals: body too large (413), then signature (401) — neither touches the database —
then malformed JSON or ids (400), then too many ids (400). Only then is the resolver asked.

Request: ``POST /outbox/check`` with ``{"txn_ids": ["<uuid>", ...]}``.
Response: ``{"states": {"<uuid>": "COMMIT" | "ROLLBACK" | "UNKNOWN", ...}}``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from outbox.checks import CHECK_PATH
from outbox.checks.auth import verify
from outbox.checks.resolver import Resolver
from outbox.errors import ConfigurationError, ProtocolError
from outbox.protocol.ids import validate_transaction_id

log = logging.getLogger("outbox.checks")


@dataclass(frozen=True, kw_only=True)
class CheckSettings:
    """How the endpoint guards itself.

    Attributes:
        secret: the HMAC key shared with the checker. Required unless ``insecure_local``.
        insecure_local: accept unsigned requests (a laptop, never production). Defaults to off.
        max_skew_s: how old or new a request's timestamp may be. Defaults to 300 s.
        max_body_bytes: largest request body. Defaults to 256 KiB.
        max_batch: most transaction ids per request. Defaults to 500.
    """

    secret: bytes | None = None
    insecure_local: bool = False
    max_skew_s: float = 300.0
    max_body_bytes: int = 256 * 1024
    max_batch: int = 500

    def __post_init__(self) -> None:
        if not self.secret and not self.insecure_local:
            raise ConfigurationError(
                "a check endpoint needs a shared secret (OUTBOX_CHECK_SECRET) to authenticate "
                "the checker; pass insecure_local=True only for a local, unexposed endpoint"
            )


@dataclass(frozen=True)
class Response:
    status: int
    body: dict[str, Any]

    def encoded(self) -> bytes:
        return json.dumps(self.body, separators=(",", ":")).encode()


def body_too_large(settings: CheckSettings, length: int) -> Response | None:
    """Checked on Content-Length before the body is read."""
    if length > settings.max_body_bytes:
        return _error(413, f"body of {length} bytes is over the limit of {settings.max_body_bytes}")
    return None


def handle(
    settings: CheckSettings,
    resolver: Resolver,
    *,
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes,
) -> Response:
    if path != CHECK_PATH:
        return _error(404, f"no such endpoint {path!r}; checks go to {CHECK_PATH}")
    if method.upper() != "POST":
        return _error(405, f"{method} is not allowed; use POST")
    refused = body_too_large(settings, len(body)) or _authenticate(
        settings, method, path, headers, body
    )
    if refused is not None:
        return refused
    try:
        txn_ids = _parse(body)
    except ProtocolError as err:
        return _error(400, str(err))
    if len(txn_ids) > settings.max_batch:
        return _error(
            400, f"{len(txn_ids)} ids is more than the batch limit of {settings.max_batch}"
        )
    states = resolver.resolve(txn_ids)
    return Response(200, {"states": {t: states[t].value for t in txn_ids}})


def _authenticate(
    settings: CheckSettings, method: str, path: str, headers: dict[str, str], body: bytes
) -> Response | None:
    if settings.secret is None:
        return None
    why = verify(settings.secret, method, path, headers, body, max_skew_s=settings.max_skew_s)
    if why is not None:
        log.warning("check request refused: %s", why)
        return _error(401, why)
    return None


def _parse(body: bytes) -> list[str]:
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ProtocolError(f"body is not JSON: {err}") from err
    if not isinstance(document, dict) or not isinstance(document.get("txn_ids"), list):
        raise ProtocolError('body must be a JSON object {"txn_ids": [...]}')
    ids = document["txn_ids"]
    for i, txn_id in enumerate(ids):
        try:
            validate_transaction_id(txn_id)
        except ProtocolError as err:
            raise ProtocolError(f"txn_ids[{i}]: {err}") from err
    return list(dict.fromkeys(ids))


def _error(status: int, message: str) -> Response:
    return Response(status, {"error": message})

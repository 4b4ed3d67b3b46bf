"""One check request in, one HTTP status and JSON body out — for every transport.

Order of refusals: body too large (413), then signature, timestamp and replay (401) — none of
them touches the database — then a malformed request (400), a request addressed to another
instance (421), too many ids (400). Only then is the resolver asked. The request and reply
formats are :mod:`outbox.protocol.check`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from outbox.checks.auth import ReplayGuard, verify
from outbox.checks.resolver import Resolver
from outbox.errors import ConfigurationError, ProtocolError
from outbox.metrics import ProducerMetrics
from outbox.protocol.check import CHECK_PATH, CheckRequest, decode_request, encode_reply
from outbox.protocol.states import LocalTransactionState

log = logging.getLogger("outbox.checks")

#: The setting that holds the shared secret, named in errors (the producers' and the checker's).
SECRET_SETTING = "OUTBOX_CHECK_SECRET"


@dataclass(frozen=True, kw_only=True)
class CheckSettings:
    """How the endpoint guards itself.

    Attributes:
        secret: the HMAC key shared with the checker. Required unless ``insecure_local``.
        previous_secret: while the secret is rotated, the one it replaces: requests signed
            with either are accepted, so the endpoints can take the new secret before the
            checker signs with it. None (the default) accepts ``secret`` only.
        insecure_local: accept unsigned requests (a laptop, never production). Defaults to off.
        max_skew_s: how old or new a request's timestamp may be. Defaults to 300 s.
        max_body_bytes: largest request body. Defaults to 1 MiB (a request carries the half
            messages it asks about; the checker leaves out values that do not fit).
        max_batch: most transaction ids per request. Defaults to 500.
    """

    secret: bytes | None = None
    previous_secret: bytes | None = None
    insecure_local: bool = False
    max_skew_s: float = 300.0
    max_body_bytes: int = 1024 * 1024
    max_batch: int = 500

    def __post_init__(self) -> None:
        if not self.secret and not self.insecure_local:
            raise ConfigurationError(
                "a check endpoint needs the secret it shares with the checker (the checker's "
                f"{SECRET_SETTING}) to authenticate it; pass insecure_local=True only for a "
                "local, unexposed endpoint"
            )
        if self.previous_secret is not None and not self.secret:
            raise ConfigurationError(
                "previous_secret is set without secret: while rotating, set the new secret "
                f"({SECRET_SETTING}) and the one it replaces (OUTBOX_CHECK_PREVIOUS_SECRET)"
            )

    @property
    def accepted(self) -> tuple[bytes, ...]:
        """The secrets a request may be signed with: the current one, then the previous."""
        return tuple(s for s in (self.secret, self.previous_secret) if s)


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


class CheckHandler:
    """Answers check requests for one endpoint instance.

    ``instance_id`` is the registration this endpoint heartbeats under: a request addressed to
    another instance is refused (a request captured on its way to one instance cannot be
    replayed against another). None accepts any. ``metrics`` counts every answer given, here
    where the threaded and the ASGI endpoint both answer, whichever resolver gave it.
    """

    def __init__(
        self,
        settings: CheckSettings,
        resolver: Resolver,
        *,
        instance_id: str | None = None,
        metrics: ProducerMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.resolver = resolver
        self.instance_id = instance_id
        self.metrics = metrics
        self._replays = ReplayGuard(settings.max_skew_s)

    def handle(self, *, method: str, path: str, headers: dict[str, str], body: bytes) -> Response:
        admitted = self.admit(method=method, path=path, headers=headers, body=body)
        if isinstance(admitted, Response):
            return admitted
        return self.answer(admitted, self.resolver.resolve(admitted.transactions))

    def admit(
        self, *, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> Response | CheckRequest:
        """The request to answer, or the refusal; touches no database (the asyncio endpoint
        runs it on its loop and awaits the resolver apart)."""
        if path != CHECK_PATH:
            return _error(404, f"no such endpoint {path!r}; checks go to {CHECK_PATH}")
        if method.upper() != "POST":
            return _error(405, f"{method} is not allowed; use POST")
        refused = body_too_large(self.settings, len(body)) or self._authenticate(
            method, path, headers, body
        )
        if refused is not None:
            return refused
        try:
            request = decode_request(body)
        except ProtocolError as err:
            return _error(400, str(err))
        if (
            self.instance_id is not None
            and request.instance_id is not None
            and request.instance_id != self.instance_id
        ):
            return _error(
                421,
                f"this request is addressed to instance {request.instance_id!r}; this is "
                f"{self.instance_id!r}",
            )
        if len(request.transactions) > self.settings.max_batch:
            return _error(
                400,
                f"{len(request.transactions)} ids is more than the batch limit of "
                f"{self.settings.max_batch}",
            )
        return request

    def answer(
        self, request: CheckRequest, states: Mapping[str, LocalTransactionState]
    ) -> Response:
        """The reply: a state for every id asked about (a missing one is UNKNOWN)."""
        unknown = LocalTransactionState.UNKNOWN
        answers = {t: states.get(t, unknown) for t in request.txn_ids}
        if self.metrics is not None:
            self.metrics.answered(answers.values())
        return Response(200, encode_reply(answers))

    def _authenticate(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> Response | None:
        if not self.settings.secret:
            return None
        now = time.time()
        refusal = verify(
            self.settings.accepted,
            method,
            path,
            headers,
            body,
            max_skew_s=self.settings.max_skew_s,
            now=now,
            replays=self._replays,
        )
        if refusal is None:
            return None
        log.warning("check request refused: %s", refusal.reason)
        response = _error(401, refusal.reason)
        if refusal.stale:  # the checker signs with our clock from now on
            response.body["time"] = now
        return response


def _error(status: int, message: str) -> Response:
    return Response(status, {"error": message})

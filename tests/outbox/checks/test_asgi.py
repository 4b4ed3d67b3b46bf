"""The ASGI app answers exactly like the threaded server (driven with ASGI messages directly)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from outbox.checks import CHECK_PATH
from outbox.checks.asgi import CheckApp
from outbox.checks.auth import sign
from outbox.checks.handler import CheckSettings
from outbox.protocol import LocalTransactionState, new_transaction_id
from outbox.protocol.check import CheckedTransaction

SECRET = b"k"


class Fixed:
    def __init__(self) -> None:
        self.calls = 0

    def resolve(self, checks: Sequence[CheckedTransaction]) -> dict[str, LocalTransactionState]:
        self.calls += 1
        return {c.txn_id: LocalTransactionState.COMMIT for c in checks}


def call(app: CheckApp, body: bytes, headers: dict[str, str], chunk: int = 7) -> tuple[int, Any]:
    pieces = [body[i : i + chunk] for i in range(0, len(body), chunk)] or [b""]
    messages = [
        {"type": "http.request", "body": p, "more_body": i < len(pieces) - 1}
        for i, p in enumerate(pieces)
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": CHECK_PATH,
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
    }
    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], json.loads(sent[1]["body"])


def test_asgi_app_answers_a_signed_batch_sent_in_chunks() -> None:
    resolver = Fixed()
    app = CheckApp(CheckSettings(secret=SECRET), resolver)
    ids = [new_transaction_id(), new_transaction_id()]
    body = json.dumps({"txn_ids": ids}).encode()
    status, answer = call(app, body, sign(SECRET, "POST", CHECK_PATH, body))
    assert status == 200
    assert answer == {"states": {t: "COMMIT" for t in ids}}


def test_asgi_app_refuses_unsigned_and_oversized_requests_without_resolving() -> None:
    resolver = Fixed()
    app = CheckApp(CheckSettings(secret=SECRET, max_body_bytes=100), resolver)
    body = json.dumps({"txn_ids": [new_transaction_id()]}).encode()
    assert call(app, body, {})[0] == 401
    assert call(app, b"x" * 500, {})[0] == 413
    assert call(app, b"x" * 500, {"content-length": "500"})[0] == 413
    assert resolver.calls == 0

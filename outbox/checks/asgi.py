"""The check endpoint as an ASGI app, for FastAPI/Starlette services::

app.mount("/", CheckApp(CheckSettings(secret=...), FencedResolver(engine, "orders")))
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from outbox.checks.handler import CheckHandler, CheckSettings, Response, body_too_large
from outbox.checks.resolver import Resolver

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class CheckApp:
    """An ASGI 3 application; the resolver (blocking DB work) runs in a worker thread."""

    def __init__(
        self, settings: CheckSettings, resolver: Resolver, *, instance_id: str | None = None
    ) -> None:
        self.settings = settings
        self.resolver = resolver
        self._checks = CheckHandler(settings, resolver, instance_id=instance_id)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
        length = int(headers.get("content-length") or 0)
        response = body_too_large(self.settings, length)
        if response is None:
            body, size = await self._body(receive)
            response = body_too_large(self.settings, size)
        if response is None:
            response = await asyncio.to_thread(
                self._checks.handle,
                method=scope["method"],
                path=scope["path"],
                headers=headers,
                body=body,
            )
        await _reply(send, response)

    async def _body(self, receive: Receive) -> tuple[bytes, int]:
        """The body and its size; past the limit only the size is kept (it will be refused)."""
        chunks, size = [], 0
        while True:
            message = await receive()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size <= self.settings.max_body_bytes:
                chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks), size


async def _reply(send: Send, response: Response) -> None:
    data = response.encoded()
    await send(
        {
            "type": "http.response.start",
            "status": response.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})

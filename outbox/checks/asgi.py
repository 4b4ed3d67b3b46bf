"""The check endpoint as an ASGI app, for FastAPI/Starlette services.

Made by the producer, which also heartbeats it to the registry so the checker finds it::

    check_app = producer.check_app(engine=async_engine, secret=..., advertise_url=...)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with check_app.running():      # the heartbeat, while the app serves
            yield

    app = FastAPI(lifespan=lifespan)
    app.mount("/", check_app)                 # last: it answers only /outbox/check

Served on its own (``uvicorn module:check_app``) it runs the heartbeat from the ASGI lifespan
events itself; a mounted app gets no lifespan events, hence ``running()``.

The request is authenticated on the loop (no database work); the answer comes from an asyncio
resolver awaited on the loop (:class:`~outbox.checks.async_resolver.AsyncFencedResolver`) or a
synchronous one run in a worker thread, so the loop never waits on the database. Several workers
(``uvicorn --workers``, pods behind one Service) each heartbeat an instance id of their own under
the same URL; a request reaches whichever of them the server hands it to, and every one of them
answers it (they share the database): the instance a request names is not checked here, its
signature, age and nonce are.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from outbox.checks.handler import CheckHandler, CheckSettings, Response, body_too_large
from outbox.checks.resolver import Resolver
from outbox.checks.routing import CheckRouter
from outbox.metrics import ProducerMetrics

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
#: Started when the app starts serving; returns what stops it.
Starter = Callable[[], Callable[[], None]]

log = logging.getLogger("outbox.checks")


class CheckApp:
    """An ASGI 3 application answering checks.

    Args:
        settings: how requests are authenticated and bounded.
        resolver: a :class:`~outbox.checks.routing.CheckRouter` (asyncio resolvers awaited) or
            any synchronous resolver (run in a worker thread).
        start: run when the app starts serving (the producer's heartbeat), returning what stops
            it; run in a worker thread, as it talks to Kafka.
        instance_id: the one instance requests must be addressed to; None answers any (several
            workers behind one URL).
        metrics: counts the answers (``outbox_producer_checks_answered_total``).
    """

    def __init__(
        self,
        settings: CheckSettings,
        resolver: Resolver | CheckRouter,
        *,
        start: Starter | None = None,
        on_loop: Callable[[asyncio.AbstractEventLoop], None] | None = None,
        instance_id: str | None = None,
        metrics: ProducerMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.resolver = resolver
        self._checks = CheckHandler(settings, _unused, instance_id=instance_id, metrics=metrics)
        self._start = start
        self._on_loop = on_loop
        self._stop: Callable[[], None] | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[CheckApp]:
        """Serve as started: the heartbeat runs until the block ends (a FastAPI lifespan)."""
        await self.startup()
        try:
            yield self
        finally:
            await self.shutdown()

    async def startup(self) -> None:
        if self._on_loop is not None:  # the listener's async checks run on this loop
            self._on_loop(asyncio.get_running_loop())
        if self._start is not None and self._stop is None:
            self._stop = await asyncio.to_thread(self._start)

    async def shutdown(self) -> None:
        stop, self._stop = self._stop, None
        if stop is not None:
            await asyncio.to_thread(stop)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
        length = int(headers.get("content-length") or 0)
        response = body_too_large(self.settings, length)
        if response is None:
            body, size = await self._body(receive)
            response = body_too_large(self.settings, size) or await self._answer(
                scope, headers, body
            )
        await _reply(send, response)

    async def _answer(self, scope: Scope, headers: dict[str, str], body: bytes) -> Response:
        admitted = self._checks.admit(
            method=scope["method"], path=_path(scope), headers=headers, body=body
        )
        if isinstance(admitted, Response):
            return admitted
        if isinstance(self.resolver, CheckRouter):
            states = await self.resolver.resolve_async(admitted.transactions)
        else:
            states = await asyncio.to_thread(self.resolver.resolve, admitted.transactions)
        return self._checks.answer(admitted, states)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as err:
                    log.exception("the check endpoint could not start")
                    await send({"type": "lifespan.startup.failed", "message": str(err)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

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


class _Unused:
    """The handler's own resolver is never asked: the app awaits its resolver itself."""

    def resolve(self, checks: Any) -> dict[str, Any]:  # pragma: no cover
        raise AssertionError("CheckApp resolves outside the handler")


_unused = _Unused()


def _path(scope: Scope) -> str:
    """The request path below where the app is mounted (``root_path``), if the server left the
    mount prefix in ``path`` (Starlette does)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and (path == root or path.startswith(root.rstrip("/") + "/")):
        return path[len(root.rstrip("/")) :] or "/"
    return path


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

"""The check endpoint: answers "did transaction X commit?" for the checker, in batches.

- :mod:`outbox.checks.auth` — HMAC-SHA256 request signatures (shared with the checker), replays;
- :mod:`outbox.checks.resolver` — the fenced resolution from the evidence table;
- :mod:`outbox.checks.async_resolver` — the same on an ``AsyncEngine``, for asyncio services;
- :mod:`outbox.checks.listener` — the application's ``check_local_transaction(message)``;
- :mod:`outbox.checks.routing` — each check to the evidence table or the listener;
- :mod:`outbox.checks.handler` — one request in, one status and JSON body out;
- :mod:`outbox.checks.server` — a ready-to-run threaded HTTP server;
- :mod:`outbox.checks.asgi` — an ASGI app to mount in FastAPI/Starlette (``producer.check_app``),
  its heartbeat run from its lifespan.
"""

from __future__ import annotations

from outbox.protocol.check import CHECK_PATH

__all__ = ["CHECK_PATH"]

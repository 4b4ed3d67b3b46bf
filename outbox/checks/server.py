"""A ready-to-run threaded HTTP server for the check endpoint (standard library only)."""

from __future__ import annotations

import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from outbox.checks.handler import CheckHandler, CheckSettings, Response, body_too_large
from outbox.checks.resolver import Resolver
from outbox.metrics import ProducerMetrics


class CheckServer:
    """Serves checks on ``host:port`` in a background thread until ``close()``.

    ``instance_id``: the registration it heartbeats under (see :class:`CheckHandler`).
    ``metrics``: counts the answers (``outbox_producer_checks_answered_total``).

    A process forked from the one that started it (a preloading server's worker,
    :mod:`outbox.forking`) has no serving thread: the parent's thread alone serves, for the whole
    producer group, and a ``close()`` there only lets go of the worker's copy of the socket.
    """

    def __init__(
        self,
        settings: CheckSettings,
        resolver: Resolver,
        host: str,
        port: int,
        *,
        instance_id: str | None = None,
        metrics: ProducerMetrics | None = None,
    ) -> None:
        checks = CheckHandler(settings, resolver, instance_id=instance_id, metrics=metrics)
        handler = _handler_class(checks)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._pid = os.getpid()
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="outbox-check-server", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def close(self) -> None:
        """Stop serving and close the socket; in a forked process, close only its copy of the
        socket (``shutdown()`` would wait for ever for a serving thread that is not there)."""
        if os.getpid() != self._pid:
            # only this process's copy of the socket; serving and its threads are the parent's
            self._server.socket.close()
            return
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


def _handler_class(checks: CheckHandler) -> type[BaseHTTPRequestHandler]:
    settings = checks.settings

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            response = body_too_large(settings, length)
            if response is None:
                body = self.rfile.read(length)
                response = checks.handle(
                    method="POST",
                    path=self.path,
                    headers={k.lower(): v for k, v in self.headers.items()},
                    body=body,
                )
            self._reply(response)

        def do_GET(self) -> None:
            self._reply(checks.handle(method="GET", path=self.path, headers={}, body=b""))

        def _reply(self, response: Response) -> None:
            data = response.encoded()
            self.send_response(response.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if response.status == 413:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # quiet: the handler logs refusals
            pass

    return Handler

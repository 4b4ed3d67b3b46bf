"""``/healthz``, ``/readyz`` and ``/metrics`` for the long-running services (relay, checker).

Standard library only, so the library stays light; the services pass in how to judge their
health and how to render their metrics (prometheus-client's ``generate_latest``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: A probe answers (ok, one line saying why).
Probe = Callable[[], tuple[bool, str]]

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ServiceEndpoint:
    """Serves the probes and metrics on ``host:port`` in a background thread until ``close()``.

    ``/healthz`` (liveness) fails when the service's loop is stuck; ``/readyz`` (readiness)
    fails while it cannot do its work (no broker, no assignment yet, a failing commit).
    """

    def __init__(
        self,
        *,
        live: Probe,
        ready: Probe,
        metrics: Callable[[], bytes],
        host: str = "0.0.0.0",
        port: int = 0,
        name: str = "outbox-service-http",
    ) -> None:
        routes: dict[str, Callable[[], tuple[int, str, bytes]]] = {
            "/healthz": lambda: _probe(live),
            "/readyz": lambda: _probe(ready),
            "/metrics": lambda: (200, METRICS_CONTENT_TYPE, metrics()),
        }
        self._server = ThreadingHTTPServer((host, port), _handler(routes))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name=name, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


def _probe(probe: Probe) -> tuple[int, str, bytes]:
    try:
        ok, why = probe()
    except Exception as err:  # a probe that raises is a failing probe, never a crash
        ok, why = False, f"probe failed: {err!r}"
    return (200 if ok else 503), "text/plain; charset=utf-8", (why + "\n").encode()


def _handler(routes: dict[str, Callable[[], tuple[int, str, bytes]]]) -> Any:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            route = routes.get(self.path.split("?", 1)[0])
            if route is None:
                status, kind, body = 404, "text/plain; charset=utf-8", b"not found\n"
            else:
                status, kind, body = route()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # probes every few seconds would drown the service's own log

    return Handler

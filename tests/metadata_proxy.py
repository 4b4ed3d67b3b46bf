"""A TCP proxy in front of a broker that closes the connections of the next Metadata requests it
is told to drop, as a broker restarting or a load balancer reaping connections would: what a
client asks then fails with librdkafka's ``_TRANSPORT`` (:mod:`outbox.topic_metadata`). A count,
not a time window, so that a loaded machine cannot let the request under test slip past it.

Only the bootstrap connection goes through it: the broker's metadata names its own address,
which a client uses from then on.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: The Kafka protocol's API key of a Metadata request.
METADATA = 3


class MetadataDroppingProxy:
    """Forwards 127.0.0.1:``port`` to the broker at ``target``; :meth:`drop` closes the
    connections of the next Metadata requests, unanswered (``dropped`` counts them)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.dropped = 0
        self._to_drop = 0
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, name="metadata-proxy", daemon=True).start()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def drop(self, requests: int) -> None:
        """Close the connection of each of the next ``requests`` Metadata requests."""
        with self._lock:
            self._to_drop = requests

    def close(self) -> None:
        _close(self._server, *self._sockets)  # shut down first: wakes threads in accept()/recv()

    def _dropping(self) -> bool:
        with self._lock:
            if self._to_drop <= 0:
                return False
            self._to_drop -= 1
            self.dropped += 1
            return True

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            try:
                broker = socket.create_connection(self.target)
            except OSError:  # the broker away: the client sees a connection closed
                _close(client)
                continue
            self._sockets += [client, broker]
            threading.Thread(target=self._requests, args=(client, broker), daemon=True).start()
            threading.Thread(target=self._answers, args=(broker, client), daemon=True).start()

    def _requests(self, client: socket.socket, broker: socket.socket) -> None:
        pending = b""
        try:
            while data := client.recv(65536):
                pending += data
                while len(pending) >= 6:  # size, then the API key
                    size, api_key = struct.unpack(">ih", pending[:6])
                    if len(pending) < 4 + size:
                        break
                    if api_key == METADATA and self._dropping():
                        return  # both closed below, the request unanswered
                    broker.sendall(pending[: 4 + size])
                    pending = pending[4 + size :]
        except OSError:
            pass
        finally:
            _close(client, broker)

    def _answers(self, broker: socket.socket, client: socket.socket) -> None:
        try:
            while data := broker.recv(65536):
                client.sendall(data)
        except OSError:
            pass
        finally:
            _close(client, broker)


def _close(*sockets: socket.socket) -> None:
    for s in sockets:
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            s.close()


@contextmanager
def metadata_dropping_proxy(bootstrap: str) -> Iterator[MetadataDroppingProxy]:
    """A :class:`MetadataDroppingProxy` in front of the broker at ``bootstrap`` (host:port)."""
    host, port = bootstrap.rsplit(":", 1)
    proxy = MetadataDroppingProxy((host, int(port)))
    try:
        yield proxy
    finally:
        proxy.close()

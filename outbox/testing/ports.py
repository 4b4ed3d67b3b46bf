"""Free loopback ports for services the harness starts."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port nobody listens on right now (the OS picks it; a race is possible but rare)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])

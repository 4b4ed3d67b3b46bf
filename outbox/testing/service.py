"""The handle every provider returns for a started service."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

from outbox.errors import OutboxError


class ServiceStartError(OutboxError):
    """Raised when a test service (Kafka, PostgreSQL, a container engine) cannot be started."""


@dataclass
class RunningService:
    """A started Kafka broker or PostgreSQL server.

    ``address`` is what clients need: ``host:port`` bootstrap servers for Kafka, an SQLAlchemy URL
    for PostgreSQL. ``provider`` says how it runs ("containers", "local" or "external") so a test
    log can show it. ``stop()`` is idempotent; ``logs()`` returns the service's own log for failure
    reports.
    """

    name: str
    provider: str
    address: str
    _stop: Callable[[], None] = field(repr=False, default=lambda: None)
    _logs: Callable[[], str] = field(repr=False, default=lambda: "")
    _restart: Callable[[], None] | None = field(repr=False, default=None)
    #: For containers: the engine that runs them ("podman" or "docker").
    engine: str | None = None
    stopped: bool = field(default=False, init=False)

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            self._stop()

    def logs(self) -> str:
        return self._logs()

    def restart(self) -> None:
        """Stop and start the same service on the same address (broker-restart tests)."""
        if self._restart is None:
            raise ServiceStartError(f"{self.describe()} cannot be restarted by the harness")
        self._restart()

    def __enter__(self) -> RunningService:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def describe(self) -> str:
        engine = f" on {self.engine}" if self.engine else ""
        return f"{self.name} via {self.provider} provider{engine} at {self.address}"

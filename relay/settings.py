"""The relay's settings: one frozen object, from code or ``OUTBOX_RELAY_*`` variables."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from outbox.env import from_env
from outbox.errors import ConfigurationError
from outbox.protocol.topics import DEFAULT_PREFIX, TopicNames

ENV_PREFIX = "OUTBOX_RELAY_"


@dataclass(frozen=True, kw_only=True)
class RelaySettings:
    """What a relay instance needs.

    Attributes:
        bootstrap_servers: Kafka's ``bootstrap.servers``. Required. Env:
            ``OUTBOX_RELAY_BOOTSTRAP_SERVERS``, else ``OUTBOX_BOOTSTRAP_SERVERS``.
        topic_prefix: prefix of the internal topics. Defaults to ``__outbox``.
        group_id: consumer group the relay instances share. Defaults to ``outbox-relay``.
        batch_max_records: records promoted before progress is committed. Defaults to 1000.
        commit_interval_s: longest time between progress commits. Defaults to 0.2 s.
        poll_timeout_s: how long one poll waits for records. Defaults to 0.1 s.
        retry_backoff_s: pause before re-reading from the committed offsets after a failed
            delivery. Defaults to 1 s.
        shutdown_grace_s: how long close() may take. Defaults to 10 s.
        kafka: extra librdkafka settings for the relay's consumer and producer.
    """

    bootstrap_servers: str
    topic_prefix: str = DEFAULT_PREFIX
    group_id: str = "outbox-relay"
    batch_max_records: int = 1000
    commit_interval_s: float = 0.2
    poll_timeout_s: float = 0.1
    retry_backoff_s: float = 1.0
    shutdown_grace_s: float = 10.0
    kafka: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.bootstrap_servers:
            raise ConfigurationError(
                "bootstrap_servers is empty; set OUTBOX_RELAY_BOOTSTRAP_SERVERS"
            )
        if self.batch_max_records < 1:
            raise ConfigurationError(
                f"batch_max_records={self.batch_max_records!r} must be at least 1"
            )
        for name in ("commit_interval_s", "poll_timeout_s", "shutdown_grace_s"):
            if getattr(self, name) <= 0:
                raise ConfigurationError(f"{name}={getattr(self, name)!r} must be positive")

    @property
    def topics(self) -> TopicNames:
        return TopicNames(self.topic_prefix)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> RelaySettings:
        """Settings from ``OUTBOX_RELAY_*`` variables (``OUTBOX_BOOTSTRAP_SERVERS`` is
        shared); keyword arguments win.

        Raises:
            ConfigurationError: naming the variable and its bad value.
        """
        return from_env(
            cls,
            ENV_PREFIX,
            env,
            overrides,
            required=("bootstrap_servers",),
            fallbacks={"bootstrap_servers": "OUTBOX_BOOTSTRAP_SERVERS"},
        )

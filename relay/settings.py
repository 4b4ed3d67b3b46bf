"""The relay's settings: one frozen object, from code or ``OUTBOX_RELAY_*`` variables."""

from __future__ import annotations

import math
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from outbox.env import from_env
from outbox.errors import ConfigurationError
from outbox.protocol.topics import DEFAULT_PREFIX, TopicNames
from outbox.reading import MOST
from outbox.settings import positive_seconds, variable

ENV_PREFIX = "OUTBOX_RELAY_"
#: Settings read from the producers\' variables when the service\'s own is absent.
FALLBACKS = {name: variable(name) for name in ("bootstrap_servers", "topic_prefix")}


@dataclass(frozen=True, kw_only=True)
class RelaySettings:
    """What a relay instance needs.

    Attributes:
        bootstrap_servers: Kafka's ``bootstrap.servers``. Required. Env:
            ``OUTBOX_RELAY_BOOTSTRAP_SERVERS``, else ``OUTBOX_BOOTSTRAP_SERVERS``.
        topic_prefix: prefix of the internal topics. Defaults to ``__outbox``.
        group_id: consumer group the relay instances share. Defaults to ``outbox-relay``.
        instance_id: this instance's stable name; the Kafka ``transactional.id`` is
            ``{group_id}-{instance_id}``, so a restarted instance fences its own unfinished
            Kafka transaction at once. Use the pod name of a StatefulSet, or leave the default
            (the host name) with one instance per host.
        batch_max_records: records read before a Kafka transaction is committed, 1 to
            1,000,000 (one batch is one read). Defaults to 5000.
        commit_interval_s: longest time between two Kafka transactions. Defaults to 0.05 s.
        commit_when_caught_up: commit as soon as a poll comes back with fewer than
            ``batch_max_records`` records (nothing more is waiting) instead of waiting out
            ``commit_interval_s``: under a light load a promotion then waits for one poll, not
            for the interval; under a backlog batches stay full. Defaults to on.
        poll_timeout_s: how long one poll waits for a first record when none has arrived (it
            returns what has arrived at once: :func:`outbox.reading.consume_ready`). Defaults
            to 0.01 s.
        transaction_timeout_s: Kafka's ``transaction.timeout.ms``: how long a crashed
            instance's open Kafka transaction can hold back read_committed readers. Defaults to
            10 s.
        put_back_after_s: a transaction undecided for this long (broker time) is re-appended to
            the half topic, so the committed offsets move on (RocketMQ's put-back). Defaults to
            300 s.
        max_held_records: half records whose values are held in memory per partition; beyond
            it the oldest values are dropped and read back by offset when needed. Defaults to
            10,000.
        max_queued_ops: op records read ahead per partition while the first waits; reading the
            op partition pauses beyond it. Defaults to 20,000.
        park_retry_s: a transaction whose real topic refused a write is retried after this.
            Defaults to 30 s.
        auto_create_topics: create a missing real topic instead of parking its transactions.
            Defaults to off.
        auto_create_partitions: partitions of an auto-created topic; -1 is the broker's
            default. Defaults to -1.
        topic_refresh_s: how often the list of existing topics is refreshed. Defaults to 30 s.
        http_port: serve ``/healthz``, ``/readyz`` and ``/metrics`` on this port; 0 turns it
            off. Defaults to 0.
        http_host: address the HTTP endpoint binds. Defaults to ``0.0.0.0``.
        liveness_timeout_s: ``/healthz`` fails when the loop has not turned for this long.
            Defaults to 60 s.
        retry_backoff_s: pause before starting over after a Kafka failure. Defaults to 1 s.
        stuck_exit_s: ``python -m relay`` exits with code 3 when its loop has not turned for
            this long (a Kafka client call that never returns: librdkafka can hang in
            ``send_offsets_to_transaction`` after a broker restart), so that its supervisor
            starts a fresh process; 0 turns it off. Defaults to 120 s.
        shutdown_grace_s: how long SIGTERM may take to finish the open Kafka transaction.
            Defaults to 10 s.
        log_format: ``text`` or ``json`` (one JSON object per line). Defaults to ``text``.
        kafka: extra librdkafka settings for the relay's consumers and producer.
    """

    bootstrap_servers: str
    topic_prefix: str = DEFAULT_PREFIX
    group_id: str = "outbox-relay"
    instance_id: str = field(default_factory=socket.gethostname)
    batch_max_records: int = 5000
    commit_interval_s: float = 0.05
    commit_when_caught_up: bool = True
    poll_timeout_s: float = 0.01
    transaction_timeout_s: float = 10.0
    put_back_after_s: float = 300.0
    max_held_records: int = 10_000
    max_queued_ops: int = 20_000
    park_retry_s: float = 30.0
    auto_create_topics: bool = False
    auto_create_partitions: int = -1
    topic_refresh_s: float = 30.0
    http_port: int = 0
    http_host: str = "0.0.0.0"
    liveness_timeout_s: float = 60.0
    retry_backoff_s: float = 1.0
    stuck_exit_s: float = 120.0
    shutdown_grace_s: float = 10.0
    log_format: str = "text"
    kafka: Mapping[str, Any] = field(default_factory=dict, repr=False)  # may hold sasl.password

    def __post_init__(self) -> None:
        if not self.bootstrap_servers:
            raise ConfigurationError(
                "bootstrap_servers is empty; set OUTBOX_RELAY_BOOTSTRAP_SERVERS"
            )
        if not self.instance_id:
            raise ConfigurationError("instance_id is empty; set OUTBOX_RELAY_INSTANCE_ID")
        for name in (
            "batch_max_records",
            "max_held_records",
            "max_queued_ops",
        ):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"{name}={getattr(self, name)!r} must be at least 1")
        if self.batch_max_records > MOST:
            # One batch is one consume(); confluent-kafka refuses more, and would say so only at
            # the first poll of a relay that otherwise looked started.
            raise ConfigurationError(
                f"batch_max_records={self.batch_max_records!r} must be at most {MOST:,}"
            )
        for name in (
            "commit_interval_s",
            "poll_timeout_s",
            "transaction_timeout_s",
            "put_back_after_s",
            "shutdown_grace_s",
            "topic_refresh_s",
            "liveness_timeout_s",
            "park_retry_s",
            "retry_backoff_s",
        ):
            if not positive_seconds(getattr(self, name)):
                raise ConfigurationError(
                    f"{name}={getattr(self, name)!r} must be positive ({ENV_PREFIX}{name.upper()})"
                )
        if not math.isfinite(self.stuck_exit_s) or self.stuck_exit_s < 0:
            raise ConfigurationError(f"stuck_exit_s={self.stuck_exit_s!r} must be 0 (off) or more")
        if not 0 <= self.http_port <= 65535:
            raise ConfigurationError(f"http_port={self.http_port!r} must be 0-65535")
        if self.log_format not in ("text", "json"):
            raise ConfigurationError(f"log_format={self.log_format!r} must be 'text' or 'json'")

    @property
    def topics(self) -> TopicNames:
        return TopicNames(self.topic_prefix)

    @property
    def transactional_id(self) -> str:
        return f"{self.group_id}-{self.instance_id}"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> RelaySettings:
        """Settings from ``OUTBOX_RELAY_*`` variables (``OUTBOX_BOOTSTRAP_SERVERS`` and
        ``OUTBOX_TOPIC_PREFIX`` are shared with the producers); keyword arguments win.

        Raises:
            ConfigurationError: naming the variable and its bad value.
        """
        return from_env(
            cls,
            ENV_PREFIX,
            env,
            overrides,
            required=("bootstrap_servers",),
            fallbacks=FALLBACKS,
        )

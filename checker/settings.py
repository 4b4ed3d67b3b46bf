"""The checker's settings, from code or ``OUTBOX_CHECKER_*`` variables; RocketMQ 5 defaults."""

from __future__ import annotations

import math
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from outbox.env import from_env
from outbox.errors import ConfigurationError
from outbox.protocol.topics import DEFAULT_PREFIX, TopicNames
from outbox.settings import positive_seconds, variable

ENV_PREFIX = "OUTBOX_CHECKER_"
#: Settings read from the producers\' variables when the service\'s own is absent.
FALLBACKS = {name: variable(name) for name in ("bootstrap_servers", "topic_prefix")} | {
    "secret": variable("check_secret")  # one secret for the checker and the producers' endpoints
}


@dataclass(frozen=True, kw_only=True)
class CheckerSettings:
    """What a checker instance needs.

    Attributes:
        bootstrap_servers: Kafka's ``bootstrap.servers``. Required.
        secret: HMAC key shared with the producers' check endpoints; it signs every request.
            Required unless ``insecure_local``. Env: ``OUTBOX_CHECK_SECRET``, the producers'
            variable (or ``OUTBOX_CHECK_SECRET_FILE``, a file holding it);
            ``OUTBOX_CHECKER_SECRET`` overrides it for the checker alone. When rotating,
            restart the checker with the new secret after the producers accept it
            (``OUTBOX_CHECK_PREVIOUS_SECRET`` on their side).
        insecure_local: send unsigned requests (local endpoints only). Defaults to off.
        topic_prefix: prefix of the internal topics. Defaults to ``__outbox``.
        group_id: consumer group of the checker instances. Defaults to ``outbox-checker``.
        instance_id: this instance's stable name; its Kafka ``transactional.id`` is
            ``{group_id}-{instance_id}``, so a restarted instance fences its own unfinished
            round. Give each instance its own (a StatefulSet's pod name, or the host name).
            Defaults to the host name.
        clock_slack_s: how far apart the clocks of the brokers leading a half partition and its
            op partition may be: a restart reads decisions from this long before the oldest
            pending transaction's first record. Defaults to 10 s.
        transaction_timeout_s: a transaction younger than this is not checked (RocketMQ's
            ``transactionTimeOut``). Defaults to 6 s.
        check_interval_s: time between two checks of one transaction (RocketMQ 5's
            ``transactionCheckInterval``). Defaults to 30 s.
        check_max: UNKNOWN answers before a transaction is given up (``transactionCheckMax``).
            Defaults to 15.
        no_producer_timeout_s: a transaction whose producer group had no live instance for this
            long is given up. Defaults to 600 s.
        registry_ttl_s: a producer instance is live while its last heartbeat is younger.
            Defaults to 30 s. Keep it at least twice the producers' heartbeat interval (5 s):
            the view of the registry counts as current for half of it after the topic was last
            known read to its end (:mod:`checker.registry_currency`).
        batch_size: transaction ids per check request. Defaults to 200.
        request_max_bytes: largest check request; a request carries the half messages it asks
            about, and a value that does not fit is left out (the endpoint reads it back from
            the half topic). Keep it at most the endpoints' ``max_body_bytes``. Defaults to
            1 MiB, their default.
        request_timeout_s: one check request's timeout. Defaults to 10 s.
        failover_attempts: instances tried for one batch. Defaults to 3.
        check_concurrency: check requests in flight at once. Defaults to 4.
        breaker_threshold: share of UNKNOWN answers or errors among a group's recent checks
            that pauses the group's checks. Defaults to 0.8.
        breaker_min_samples: recent checks needed before the breaker judges. Defaults to 20.
        breaker_cooldown_s: how long a tripped group is paused. Defaults to 60 s.
        stuck_exit_s: ``python -m checker`` exits with code 3 when its loop has not turned for
            this long (a Kafka client call that never returns: librdkafka can hang in
            ``send_offsets_to_transaction`` after a broker restart; :mod:`outbox.watchdog`), so
            that its supervisor starts a fresh process; never sooner than ``/healthz`` fails
            (:attr:`liveness_limit_s`). 0 turns it off. Defaults to 120 s.
        http_port: serve ``/healthz``, ``/readyz`` and ``/metrics`` (Prometheus) on this port;
            0 turns it off. Defaults to 0.
        http_host: address the HTTP endpoint binds. Defaults to ``0.0.0.0``.
        log_format: ``text`` or ``json`` (one JSON object per line). Defaults to ``text``.
        kafka: extra librdkafka settings.
    """

    bootstrap_servers: str
    secret: str | None = field(default=None, repr=False)
    insecure_local: bool = False
    topic_prefix: str = DEFAULT_PREFIX
    group_id: str = "outbox-checker"
    instance_id: str = field(default_factory=socket.gethostname)
    clock_slack_s: float = 10.0
    transaction_timeout_s: float = 6.0
    check_interval_s: float = 30.0
    check_max: int = 15
    no_producer_timeout_s: float = 600.0
    registry_ttl_s: float = 30.0
    batch_size: int = 200
    request_max_bytes: int = 1024 * 1024
    request_timeout_s: float = 10.0
    failover_attempts: int = 3
    check_concurrency: int = 4
    breaker_threshold: float = 0.8
    breaker_min_samples: int = 20
    breaker_cooldown_s: float = 60.0
    stuck_exit_s: float = 120.0
    http_port: int = 0
    http_host: str = "0.0.0.0"
    log_format: str = "text"
    kafka: Mapping[str, Any] = field(default_factory=dict, repr=False)  # may hold sasl.password

    def __post_init__(self) -> None:
        if not self.bootstrap_servers:
            raise ConfigurationError(
                "bootstrap_servers is empty; set OUTBOX_CHECKER_BOOTSTRAP_SERVERS"
            )
        if not self.secret and not self.insecure_local:
            raise ConfigurationError(
                f"the checker signs its requests: set {variable('check_secret')} (or "
                f"{variable('check_secret')}_FILE) to the producers' check secret (or "
                "insecure_local=True for unsigned local endpoints)"
            )
        if self.request_max_bytes < 4096:
            raise ConfigurationError(
                f"request_max_bytes={self.request_max_bytes!r} must be at least 4096"
            )
        for name in ("check_max", "batch_size", "failover_attempts", "check_concurrency"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"{name}={getattr(self, name)!r} must be at least 1")
        # Each a duration that must pass: 0 would give up a transaction whose group had no live
        # instance at its first check (a rolling restart) at once, never delivered; NaN or
        # infinity would end a round in an exception or pause a group for ever.
        for name in (
            "check_interval_s",
            "registry_ttl_s",
            "request_timeout_s",
            "transaction_timeout_s",
            "no_producer_timeout_s",
            "breaker_cooldown_s",
        ):
            if not positive_seconds(getattr(self, name)):
                raise ConfigurationError(
                    f"{name}={getattr(self, name)!r} must be a positive number of seconds "
                    f"({ENV_PREFIX}{name.upper()})"
                )
        if not self.instance_id:
            raise ConfigurationError("instance_id is empty; set OUTBOX_CHECKER_INSTANCE_ID")
        if not math.isfinite(self.stuck_exit_s) or self.stuck_exit_s < 0:
            raise ConfigurationError(f"stuck_exit_s={self.stuck_exit_s!r} must be 0 (off) or more")
        if not math.isfinite(self.clock_slack_s) or self.clock_slack_s < 0:
            raise ConfigurationError(f"clock_slack_s={self.clock_slack_s!r} must be 0 or more")
        if not 0 <= self.http_port <= 65535:
            raise ConfigurationError(f"http_port={self.http_port!r} must be 0-65535")
        if self.log_format not in ("text", "json"):
            raise ConfigurationError(f"log_format={self.log_format!r} must be 'text' or 'json'")

    @property
    def topics(self) -> TopicNames:
        return TopicNames(self.topic_prefix)

    @property
    def liveness_limit_s(self) -> float:
        """How long the loop may go without turning before ``/healthz`` fails: a round waits
        at most for its check requests (each instance tried in turn) and a minute more."""
        return self.request_timeout_s * self.failover_attempts + 60

    @property
    def stuck_limit_s(self) -> float:
        """When ``python -m checker`` gives up on a loop that stopped turning (0: never):
        ``stuck_exit_s``, or the liveness limit when that is longer, so that a round that waits
        out its request timeouts is not taken for a stuck one."""
        if not self.stuck_exit_s:
            return 0.0
        return max(self.stuck_exit_s, self.liveness_limit_s)

    @property
    def client_config(self) -> dict[str, Any]:
        """librdkafka settings every Kafka client of the checker starts from."""
        return {"bootstrap.servers": self.bootstrap_servers, **self.kafka}

    @property
    def transactional_id(self) -> str:
        return f"{self.group_id}-{self.instance_id}"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> CheckerSettings:
        """Settings from ``OUTBOX_CHECKER_*`` variables (``OUTBOX_BOOTSTRAP_SERVERS`` and
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

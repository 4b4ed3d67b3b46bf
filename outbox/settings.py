"""The producer library's settings: one frozen object, from code or ``OUTBOX_*`` variables."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from outbox.env import from_env, kafka_variable
from outbox.errors import ConfigurationError
from outbox.protocol.headers import HALF_SCHEMA_VERSION, HALF_SCHEMA_VERSIONS
from outbox.protocol.op import (
    BROKER_MAX_MESSAGE_BYTES,
    CLIENT_MAX_MESSAGE_BYTES,
    max_half_offsets,
)
from outbox.protocol.topics import (
    DEFAULT_HALF_RETENTION_MS,
    DEFAULT_MIN_COMPACTION_LAG_MS,
    DEFAULT_OP_RETENTION_MS,
    DEFAULT_PREFIX,
    FOREVER,
    TopicNames,
    op_retention_problem,
)

ENV_PREFIX = "OUTBOX_"
#: Shared variables a settings object falls back on when its own is absent (none: these are
#: the producers' own). Each settings module names its ``ENV_PREFIX`` and ``FALLBACKS``; the
#: command line reads them from there.
FALLBACKS: dict[str, str] = {}


def variable(field_name: str) -> str:
    """The producers' environment variable for the setting ``field_name``; the services fall back
    on the same one (one Kafka cluster and one topic prefix for producers and services)."""
    return ENV_PREFIX + field_name.upper()


def positive_seconds(value: float) -> bool:
    """A duration setting's value is a positive number of seconds: not NaN (``float("nan")``
    parses from the environment, and compares False with everything, so a wait or a deadline
    with it never ends or ends at once) and not infinite (a wait with it overflows)."""
    return math.isfinite(value) and value > 0


@dataclass(frozen=True, kw_only=True)
class OutboxSettings:
    """What a producer needs to know.

    Attributes:
        bootstrap_servers: Kafka's ``bootstrap.servers``. Required.
            Env: ``OUTBOX_BOOTSTRAP_SERVERS``.
        producer_group: RocketMQ's producer group: which service's check endpoint answers for a
            transaction. Required. Env: ``OUTBOX_PRODUCER_GROUP``.
        topic_prefix: prefix of the internal topics. Defaults to ``__outbox``.
        partitions: partitions of the half and op topics (they always match). Defaults to 6.
        min_compaction_lag_ms: how long op records stay uncompacted (the audit window).
            Defaults to 7 days.
        half_retention_ms: ``retention.ms`` of the half topic ``ensure_topics`` creates.
            Defaults to 7 days, Kafka's own default, written on the topic so that the op
            topic's retention can be checked against it. ``-1`` keeps them forever.
            Env: ``OUTBOX_HALF_RETENTION_MS``.
        op_retention_ms: ``retention.ms`` of the op topic (``cleanup.policy=compact,delete``):
            its keys are unique transaction ids, so compaction alone never shrinks it. At
            least ``half_retention_ms`` (a decision is read, and audited, with its half
            records) and ``min_compaction_lag_ms`` (the audit window); ``-1`` keeps them
            forever. Defaults to 14 days: a half record can outlive its retention by its
            segment's roll time (7 days by default), its decision must not.
            Env: ``OUTBOX_OP_RETENTION_MS``.
        max_message_bytes: largest serialized value accepted by ``send()``. Defaults to 1 MiB.
            The whole half record (value, key, headers and the outbox's own) must also fit in
            librdkafka's ``message.max.bytes`` (1,000,000 unless ``kafka`` sets it):
            :attr:`max_record_bytes`.
        send_timeout_s: how long one half send may wait for its acknowledgement. Defaults to 10 s.
            Also how long a process's first transaction may take to read the internal topics'
            partition count, a connection dropped under that read tried again within it
            (:mod:`outbox.topic_metadata`).
        send_attempts: attempts at a half send before giving up (tenacity). Defaults to 3.
        wait_for_op: wait for the op record's acknowledgement before the transaction call
            returns. Off by default: the op is sent one-way, as RocketMQ's end-transaction,
            saving a round trip per transaction; a lost op is counted, logged and resolved by
            the checker. Env: ``OUTBOX_WAIT_FOR_OP``.
        op_timeout_s: with ``wait_for_op``, how long to wait for the acknowledgement before
            leaving the decision to the checker. Defaults to 5 s.
        op_linger_ms: how long an op record waits to share a Kafka request with other
            threads' ops (librdkafka's ``linger.ms`` of the op producer; half records, which
            a transaction waits for, keep 1 ms). Defaults to 0: an op goes out at once, and
            ops still batch under load, queued behind the requests in flight. It adds up to
            that much to the time a committed message takes to reach its real topic: with 5
            ms, interleaved runs on one broker measured end-to-end p50 5-6 ms higher at 100
            and 400 txn/s, and 16 threads committed no more transactions (median 826 against
            920 txn/s with 0, within the spread; docs/benchmarks.md). Raise it where the
            broker's request rate matters more than latency. Env: ``OUTBOX_OP_LINGER_MS``.
        half_schema_version: the version of the half records' headers this producer writes.
            Defaults to 2 (one packed ``outbox-half`` header). Set 1 while a relay, checker,
            audit or CLI older than version 2 still reads the topics (they read version 1
            only); readers read both, so upgrade them first, then producers, then drop this.
            Env: ``OUTBOX_HALF_SCHEMA_VERSION``.
        check_secret: the HMAC key the check endpoint shares with the checker, which reads
            the same variable. Env: ``OUTBOX_CHECK_SECRET``, or ``OUTBOX_CHECK_SECRET_FILE``
            naming a file that holds it (a mounted Kubernetes Secret); any setting can be read
            from a file that way. Not shown in ``repr``.
        check_previous_secret: while rotating the secret, the one it replaces: the endpoint
            accepts requests signed with either (roll the producers first, then the checker,
            then unset this). Env: ``OUTBOX_CHECK_PREVIOUS_SECRET`` (or ``..._FILE``).
        check_host: the address ``serve_checks()`` listens on. Defaults to ``127.0.0.1``
            (this host only); ``0.0.0.0`` in a deployment. Env: ``OUTBOX_CHECK_HOST``.
        check_port: its port; 0 (the default) picks a free one. Env: ``OUTBOX_CHECK_PORT``.
        check_advertise_url: where the checker reaches this producer's check endpoint, as
            announced in the registry (a pod IP, a Service name; with the prefix the ASGI app
            is mounted under). Defaults to the address ``serve_checks()`` listens on, which
            only a checker on the same host reaches. Env: ``OUTBOX_CHECK_ADVERTISE_URL``.
        database_url: the producer's database (an SQLAlchemy URL), for the operator's
            ``kafka-outbox migrate`` and ``evidence prune``; the library itself writes through
            the sessions you give it and never reads this. Env: ``OUTBOX_DATABASE_URL`` (or
            ``OUTBOX_DATABASE_URL_FILE``, which keeps the password out of ``ps`` and the
            environment). Not shown in ``repr``.
        kafka: extra librdkafka settings for the producer (passed through untouched).
    """

    bootstrap_servers: str
    producer_group: str
    topic_prefix: str = DEFAULT_PREFIX
    partitions: int = 6
    min_compaction_lag_ms: int = DEFAULT_MIN_COMPACTION_LAG_MS
    half_retention_ms: int = DEFAULT_HALF_RETENTION_MS
    op_retention_ms: int = DEFAULT_OP_RETENTION_MS
    max_message_bytes: int = 1024 * 1024
    send_timeout_s: float = 10.0
    send_attempts: int = 3
    wait_for_op: bool = False
    op_timeout_s: float = 5.0
    op_linger_ms: float = 0.0
    half_schema_version: int = HALF_SCHEMA_VERSION
    check_secret: str | None = field(default=None, repr=False)
    check_previous_secret: str | None = field(default=None, repr=False)
    check_host: str = "127.0.0.1"
    check_port: int = 0
    check_advertise_url: str | None = None
    database_url: str | None = field(default=None, repr=False)
    kafka: Mapping[str, Any] = field(default_factory=dict, repr=False)  # may hold sasl.password

    def __post_init__(self) -> None:
        if not self.bootstrap_servers:
            raise ConfigurationError("bootstrap_servers is empty; set OUTBOX_BOOTSTRAP_SERVERS")
        if not self.producer_group or len(self.producer_group) > 249:
            raise ConfigurationError(
                f"producer_group={self.producer_group!r} must be 1-249 characters; "
                "set OUTBOX_PRODUCER_GROUP to your service's name"
            )
        if any(ord(c) < 32 or ord(c) == 127 for c in self.producer_group):
            raise ConfigurationError(
                f"producer_group={self.producer_group!r} contains a control character; "
                "name the group with printable characters (it is written into every half "
                "record, log line and metric)"
            )
        if self.half_schema_version not in HALF_SCHEMA_VERSIONS:
            raise ConfigurationError(
                f"half_schema_version={self.half_schema_version!r} is not one this library "
                f"writes; use one of {', '.join(map(str, HALF_SCHEMA_VERSIONS))} "
                "(OUTBOX_HALF_SCHEMA_VERSION)"
            )
        for name in ("partitions", "max_message_bytes", "send_attempts"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"{name}={getattr(self, name)!r} must be at least 1")
        for name in ("send_timeout_s", "op_timeout_s"):
            if not positive_seconds(getattr(self, name)):
                raise ConfigurationError(f"{name}={getattr(self, name)!r} must be positive")
        self._check_retention()
        self._check_endpoint()
        self._check_kafka()
        if not 0 <= self.op_linger_ms <= 900_000:
            raise ConfigurationError(
                f"op_linger_ms={self.op_linger_ms!r} must be between 0 and 900000 "
                "(librdkafka's range for linger.ms)"
            )
        # Filled here, not on first use: on Python 3.11 a cached_property fills under one lock
        # for the whole class, which a child forked while another thread held it would never get.
        self.__dict__["topics"] = TopicNames(self.topic_prefix)

    def _check_retention(self) -> None:
        if self.min_compaction_lag_ms < 0:
            raise ConfigurationError(
                f"min_compaction_lag_ms={self.min_compaction_lag_ms!r} must be at least 0 "
                f"({variable('min_compaction_lag_ms')})"
            )
        for name in ("half_retention_ms", "op_retention_ms"):
            value = getattr(self, name)
            if value != FOREVER and value < 1:
                raise ConfigurationError(
                    f"{name}={value!r} must be positive, or -1 to keep records forever "
                    f"({variable(name)})"
                )
        problem = op_retention_problem(
            self.op_retention_ms,
            half_retention_ms=self.half_retention_ms,
            min_compaction_lag_ms=self.min_compaction_lag_ms,
        )
        if problem is not None:
            raise ConfigurationError(
                f"{problem}; set {variable('op_retention_ms')} (now {self.op_retention_ms}) to "
                f"at least {variable('half_retention_ms')} and "
                f"{variable('min_compaction_lag_ms')}, or -1 (forever)"
            )

    def _check_kafka(self) -> None:
        """The half and op records need what an idempotent producer with ``acks=all`` gives:
        an acknowledged half record that a leader's failover dropped (``acks=1``) would leave a
        COMMIT naming offsets that no longer hold it - a committed transaction's message never
        delivered."""
        wanted = {"acks": ("all", "-1"), "enable.idempotence": ("true", "1")}
        for key, allowed in wanted.items():
            value = self.kafka.get(key)
            if value is not None and str(value).strip().lower() not in allowed:
                raise ConfigurationError(
                    f"kafka[{key!r}]={value!r} would let the broker lose an acknowledged half "
                    f"record, and with it a committed transaction's message; the outbox sets "
                    f"{key}={allowed[0]} itself: remove {kafka_variable(ENV_PREFIX, key)} (or "
                    "the key from OutboxSettings.kafka)"
                )

    def _check_endpoint(self) -> None:
        if not 0 <= self.check_port <= 65535:
            raise ConfigurationError(
                f"check_port={self.check_port!r} must be 0-65535 ({variable('check_port')})"
            )
        url = self.check_advertise_url
        if url is not None and not url.startswith(("http://", "https://")):
            raise ConfigurationError(
                f"check_advertise_url={url!r} is not an http(s) URL; set "
                f"{variable('check_advertise_url')} to where the checker reaches this service, "
                "e.g. http://10.0.3.7:8081 or http://orders.shop.svc:8000"
            )
        if self.check_previous_secret and not self.check_secret:
            raise ConfigurationError(
                f"{variable('check_previous_secret')} is set but {variable('check_secret')} is "
                f"not: while rotating, set {variable('check_secret')} to the new secret and "
                f"{variable('check_previous_secret')} to the one it replaces"
            )

    @functools.cached_property
    def topics(self) -> TopicNames:
        """The internal topics' names (made once, by ``__post_init__``: each send and op
        asks)."""
        return TopicNames(self.topic_prefix)

    @property
    def max_messages_per_transaction(self) -> int:
        """The most messages one transaction may send: its op record names each one's offset
        and must fit in a Kafka record (librdkafka's ``message.max.bytes``, from ``kafka`` or
        its default, and the broker's default ``max.message.bytes``, the smaller): 49,590 by
        default (:func:`outbox.protocol.op.max_half_offsets`)."""
        return max_half_offsets(min(self.max_record_bytes, BROKER_MAX_MESSAGE_BYTES))

    @property
    def max_record_bytes(self) -> int:
        """The largest half record librdkafka sends: its ``message.max.bytes``, from ``kafka``
        or its default of 1,000,000 (:func:`outbox.protocol.record_size.refuse_oversized`)."""
        return int(self.kafka.get("message.max.bytes", CLIENT_MAX_MESSAGE_BYTES))

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        *,
        defaults: Mapping[str, Any] | None = None,
        **overrides: Any,
    ) -> OutboxSettings:
        """Settings from ``OUTBOX_*`` variables; keyword arguments win over the environment,
        which wins over ``defaults`` (an application's own defaults, e.g. its port).

        Raises:
            ConfigurationError: naming the variable and its bad value.
        """
        return from_env(
            cls,
            ENV_PREFIX,
            env,
            overrides,
            required=("bootstrap_servers", "producer_group"),
            defaults=defaults,
        )

"""The audit's settings: one frozen object, from code, ``OUTBOX_AUDIT_*`` variables or the CLI.

The thresholds follow the checker's (RocketMQ 5) defaults: a transaction is *stuck* when it has
no decision after the full check window, ``transaction_timeout + check_max x check_interval``
(6 s + 15 x 30 s); committed messages are *lost* when they are not on their real topic a grace
period after the COMMIT op.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from checker.audit.bounds import Bound, check_pair, parse_bound, parse_time_ms
from checker.audit.errors import AuditConfigError
from outbox.env import from_env
from outbox.protocol.topics import DEFAULT_PREFIX, TopicNames
from outbox.settings import variable

ENV_PREFIX = "OUTBOX_AUDIT_"
#: Settings read from the producers\' variables when the audit\'s own is absent.
FALLBACKS = {"bootstrap_servers": variable("bootstrap_servers")}


@dataclass(frozen=True, kw_only=True)
class AuditSettings:
    """What one audit reads and how it judges.

    Attributes:
        bootstrap_servers: Kafka's ``bootstrap.servers``. Required.
        topic_prefix: prefix of the internal topics. Defaults to ``__outbox``.
        start: ``--from``: ``earliest``, a time or offsets JSON (:mod:`checker.audit.bounds`).
            Transactions whose first half record lies in [start, end) are audited.
            Defaults to ``earliest``.
        end: ``--to``: ``latest``, a time or offsets JSON. Defaults to ``latest``.
        as_of: the audit's clock: records stamped after it are ignored, ages are measured to it.
            Defaults to ``now`` (when the audit starts).
        grace_s: how long after its COMMIT op a message may still be on its way to its real
            topic before it counts as lost. Defaults to 60 s.
        transaction_timeout_s, check_interval_s, check_max: the checker's settings, from which
            the check window follows. Default to 6 s, 30 s and 15 (RocketMQ 5).
        window_s: the full check window: a transaction undecided for longer is stuck. Defaults
            to ``transaction_timeout_s + check_max * check_interval_s`` (456 s).
        lookback_s: with a time ``--from``, how much earlier the topics are read, so that
            transactions begun before the window are recognised rather than taken for phantoms.
            Defaults to ``window_s + grace_s``.
        real_topics: real topics to read besides those the half records name. Defaults to none.
        evidence_url: the producers' database (``jdbc:postgresql://...``, a SQLAlchemy
            ``postgresql://`` URL, or ``sqlite:///`` read on the driver). Defaults to none.
        evidence_user, evidence_password: JDBC credentials when not in the URL.
        evidence_table: Defaults to ``outbox_evidence``.
        evidence_groups: producer groups whose transactions the evidence table covers. Defaults
            to the groups found in the table.
        out_dir: where the JSON summary, the HTML report and the Parquet findings go.
            Defaults to ``outbox-audit``.
        parquet_dir: where the Parquet findings go, when not under ``out_dir`` (on a cluster:
            a path every executor can write, e.g. ``hdfs://`` or ``s3a://``).
        report_rows: rows of each finding shown in the HTML report. Defaults to 200.
        metadata_timeout_s: how long to wait for Kafka's metadata. Defaults to 15 s.
        kafka: extra Kafka (Java) client settings for Spark's Kafka source and the metadata
            client, e.g. ``security.protocol``. Defaults to none.
    """

    bootstrap_servers: str
    topic_prefix: str = DEFAULT_PREFIX
    start: str = "earliest"
    end: str = "latest"
    as_of: str = "now"
    grace_s: float = 60.0
    transaction_timeout_s: float = 6.0
    check_interval_s: float = 30.0
    check_max: int = 15
    window_s: float | None = None
    lookback_s: float | None = None
    real_topics: tuple[str, ...] = ()
    evidence_url: str | None = None
    evidence_user: str | None = None
    evidence_password: str | None = field(default=None, repr=False)
    evidence_table: str = "outbox_evidence"
    evidence_groups: tuple[str, ...] = ()
    out_dir: str = "outbox-audit"
    parquet_dir: str | None = None
    report_rows: int = 200
    metadata_timeout_s: float = 15.0
    kafka: Mapping[str, Any] = field(default_factory=dict, repr=False)  # may hold sasl.password

    def __post_init__(self) -> None:
        for name in ("real_topics", "evidence_groups"):
            value = getattr(self, name)
            if isinstance(value, str):  # from an environment variable: comma-separated
                object.__setattr__(self, name, tuple(v for v in value.split(",") if v.strip()))
        if not self.bootstrap_servers:
            raise AuditConfigError(
                "bootstrap_servers is empty; pass --bootstrap-servers or set "
                "OUTBOX_AUDIT_BOOTSTRAP_SERVERS"
            )
        for name in ("grace_s", "transaction_timeout_s", "check_interval_s"):
            if getattr(self, name) < 0:
                raise AuditConfigError(f"{name}={getattr(self, name)!r} must not be negative")
        for name in ("window_s", "lookback_s"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise AuditConfigError(f"{name}={value!r} must not be negative")
        if self.check_max < 1 or self.report_rows < 0:
            raise AuditConfigError("check_max must be at least 1 and report_rows not negative")
        self.resolve(now_ms=0)  # refuses bad bounds now, not after Spark has started

    @property
    def topics(self) -> TopicNames:
        return TopicNames(self.topic_prefix)

    @property
    def window_ms(self) -> int:
        if self.window_s is not None:
            return round(self.window_s * 1000)
        return round((self.transaction_timeout_s + self.check_max * self.check_interval_s) * 1000)

    @property
    def grace_ms(self) -> int:
        return round(self.grace_s * 1000)

    @property
    def lookback_ms(self) -> int:
        if self.lookback_s is not None:
            return round(self.lookback_s * 1000)
        return self.window_ms + self.grace_ms

    def resolve(self, *, now_ms: int) -> Resolved:
        """The bounds and the clock with ``now`` fixed.

        Raises:
            AuditConfigError: a bound or ``as_of`` that does not parse, or a pair that cannot
                describe a range.
        """
        start = parse_bound(self.start, now_ms=now_ms, what="--from")
        end = parse_bound(self.end, now_ms=now_ms, what="--to")
        check_pair(start, end)
        as_of_ms = parse_time_ms(self.as_of, now_ms=now_ms, what="--as-of")
        return Resolved(start=start, end=end, as_of_ms=as_of_ms)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> AuditSettings:
        """Settings from ``OUTBOX_AUDIT_*`` variables or the config file's ``[audit]`` section
        (``OUTBOX_BOOTSTRAP_SERVERS`` is shared); keyword arguments win.

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


@dataclass(frozen=True)
class Resolved:
    """The bounds of one audit run, with ``now`` fixed."""

    start: Bound
    end: Bound
    as_of_ms: int

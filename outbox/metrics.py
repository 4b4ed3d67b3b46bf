"""The producer's Prometheus metrics, when ``prometheus_client`` is installed.

A producer application need not install it (``pip install 'kafka-outbox[metrics]'`` brings it):
``prometheus_client`` is imported when an :class:`~outbox.OutboxProducer` is created, not by
``import outbox``, and where it is missing the producer's ``metrics`` is None and every counted
spot costs one ``is None`` check. Where it is installed the metrics go to its default
``REGISTRY`` (what ``prometheus_client.make_asgi_app()``, ``start_http_server()`` and
django-prometheus serve), or to the registry given as ``OutboxProducer(...,
metrics_registry=...)``.

prometheus_client refuses a second collector of a name in one registry ("Duplicated
timeseries"), and a process may hold several producers (one per producer group, or a second one
in a test), so the collectors are made once per registry and shared, each producer counting
under its ``group`` label. No label carries a transaction id: one series per transaction would
grow without end.

- ``outbox_producer_half_send_seconds`` (histogram; ``group``): each half send attempt Kafka
  acknowledged, from its records handed to librdkafka to the broker's acknowledgement.
- ``outbox_producer_half_send_failures_total`` (``group``, ``reason``): each attempt that failed,
  by :attr:`~outbox.errors.HalfSendError.reason` (``timeout``, ``refused``, ``queue_full``,
  ``error``); a send is retried up to ``send_attempts`` times before its transaction fails.
- ``outbox_producer_ops_written_total`` / ``outbox_producer_ops_failed_total`` (``group``,
  ``state``: COMMIT or ROLLBACK): op records the broker took, and those it did not (refused, not
  acknowledged in time, producer closed), whose transactions the checker decides.
- ``outbox_producer_checks_answered_total`` (``group``, ``answer``: COMMIT, ROLLBACK or
  UNKNOWN): each transaction this process's check endpoint answered about (threaded or ASGI;
  from the evidence table or the listener).
- ``outbox_producer_fences_total`` (``group``): checks that fenced a transaction, writing the
  fence row that makes its late commit fail.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from outbox.errors import ConfigurationError
from outbox.protocol.states import LocalTransactionState, OpState

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Counter, Histogram

#: Half send latencies: a few ms on a healthy broker, up to ``send_timeout_s`` (10 s).
HALF_SEND_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10)


@dataclass(frozen=True)
class _Collectors:
    """The producer metrics of one registry, shared by every producer reporting to it."""

    half_send_seconds: Histogram
    half_send_failures: Counter
    ops_written: Counter
    ops_failed: Counter
    checks_answered: Counter
    fences: Counter
    heartbeats_failed: Counter


_registries: weakref.WeakKeyDictionary[Any, _Collectors] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


class ProducerMetrics:
    """One producer group's metrics in one registry: what the producer, its Kafka I/O and its
    check endpoint count with. Each method is a label lookup done in advance and an ``inc()``."""

    def __init__(self, collectors: _Collectors, group: str) -> None:
        self.group = group
        self._collectors = collectors
        self._half_seconds = collectors.half_send_seconds.labels(group=group)
        self._written = {s: collectors.ops_written.labels(group=group, state=s.value) for s in _OPS}
        self._failed = {s: collectors.ops_failed.labels(group=group, state=s.value) for s in _OPS}
        self._answered = {
            s: collectors.checks_answered.labels(group=group, answer=s.value)
            for s in LocalTransactionState
        }
        self._fences = collectors.fences.labels(group=group)

    def half_acknowledged(self, seconds: float) -> None:
        """A half send attempt was acknowledged ``seconds`` after its records were handed over."""
        self._half_seconds.observe(seconds)

    def half_failed(self, reason: str) -> None:
        """A half send attempt failed (``HalfSendError.reason``); rare, so labelled on the spot."""
        self._collectors.half_send_failures.labels(group=self.group, reason=reason).inc()

    def op_written(self, state: OpState) -> None:
        """The broker took an op record."""
        self._written[state].inc()

    def op_failed(self, state: OpState) -> None:
        """An op record was not written; the checker will decide its transaction."""
        self._failed[state].inc()

    def answered(self, answers: Iterable[LocalTransactionState]) -> None:
        """The check endpoint answered these (one per transaction asked about)."""
        for answer in answers:
            self._answered[answer].inc()

    def fenced(self) -> None:
        """A check wrote a fence row: the transaction it names can no longer commit."""
        self._fences.inc()

    def heartbeat_failed(self, reason: str) -> None:
        """A heartbeat did not reach the registry topic (``reason``: Kafka's error name)."""
        self._collectors.heartbeats_failed.labels(group=self.group, reason=reason).inc()


#: The op states a producer writes (GIVEN_UP and RESUMED are the checker's and the CLI's).
_OPS = (OpState.COMMIT, OpState.ROLLBACK)


def producer_metrics(
    group: str, registry: CollectorRegistry | None = None
) -> ProducerMetrics | None:
    """The metrics of producer group ``group`` in ``registry`` (None: prometheus_client's default
    ``REGISTRY``); None when prometheus_client is not installed and no registry was given.

    Raises:
        ConfigurationError: the registry already holds a collector of one of these names that
            was not made here (e.g. by a second copy of this module).
    """
    if registry is None:
        try:
            from prometheus_client import REGISTRY
        except ImportError:
            return None
        registry = REGISTRY
    with _lock:
        collectors = _registries.get(registry)
        if collectors is None:
            collectors = _registries[registry] = _make(registry)
    return ProducerMetrics(collectors, group)


def _make(registry: CollectorRegistry) -> _Collectors:
    from prometheus_client import Counter, Histogram

    try:
        return _Collectors(
            half_send_seconds=Histogram(
                "outbox_producer_half_send_seconds",
                "Time from a half send attempt's records handed to librdkafka to their "
                "acknowledgement by the broker (acknowledged attempts only).",
                ["group"],
                registry=registry,
                buckets=HALF_SEND_BUCKETS,
            ),
            half_send_failures=Counter(
                "outbox_producer_half_send_failures",
                "Half send attempts that failed, by reason: timeout, refused, queue_full, "
                "error. A send is retried up to send_attempts times before its transaction "
                "fails.",
                ["group", "reason"],
                registry=registry,
            ),
            ops_written=Counter(
                "outbox_producer_ops_written",
                "Op records (the local outcome) the broker took, by state.",
                ["group", "state"],
                registry=registry,
            ),
            ops_failed=Counter(
                "outbox_producer_ops_failed",
                "Op records not written (refused, timed out, producer closed); the checker "
                "decides those transactions from the check endpoint.",
                ["group", "state"],
                registry=registry,
            ),
            checks_answered=Counter(
                "outbox_producer_checks_answered",
                "Transactions this process's check endpoint answered about, by answer.",
                ["group", "answer"],
                registry=registry,
            ),
            fences=Counter(
                "outbox_producer_fences",
                "Checks that fenced a transaction: wrote the fence row that makes its late "
                "commit fail (answered ROLLBACK).",
                ["group"],
                registry=registry,
            ),
            heartbeats_failed=Counter(
                "outbox_producer_heartbeats_failed",
                "Heartbeats of a check endpoint that did not reach the registry topic, by "
                "Kafka's error (TOPIC_AUTHORIZATION_FAILED: an ACL missing). While none "
                "arrives the checker finds no live instance and, after no_producer_timeout_s, "
                "gives up the group's undecided transactions.",
                ["group", "reason"],
                registry=registry,
            ),
        )
    except ValueError as err:  # "Duplicated timeseries in CollectorRegistry"
        raise ConfigurationError(
            f"this registry already has outbox producer metrics not made by outbox.metrics "
            f"({err}); give the producer a registry of its own (metrics_registry=)"
        ) from err

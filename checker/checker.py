"""The checker: finds transactions whose outcome never arrived and asks their producers.

It reads the half and op topics of the partitions it owns (a consumer group, range assignor, so
one instance owns partition p of both topics). Before anything of a partition is checked, its op
partition has been read to its end, so nothing already decided is checked. Answers become op
records (decided by: checker). After ``check_max`` UNKNOWN answers, or when no producer of the
group has been live for ``no_producer_timeout_s``, the transaction is given up: a GIVEN_UP op,
and its messages with the reason on the dead-letter topic.

This module is the service's life cycle: the parts that outlive a session (statistics, circuit
breakers, refusals, the check client, health, the registry's reader) are made here and handed to
each session (:mod:`checker.session`), which a failure ends and the next one replaces.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict

from confluent_kafka import KafkaException

from checker.breaker import Breaker
from checker.client import CheckClient
from checker.instances import LiveInstances
from checker.plan import CheckerStats
from checker.session import Restart, Session
from checker.settings import ENV_PREFIX, CheckerSettings
from checker.tracker import Tracker
from checker.writer import Refusals, RoundFailed
from outbox import tracing
from outbox.broker_clock import BrokerClock
from outbox.errors import ConfigurationError, OutboxError
from outbox.fork_checks import check_if_forked
from outbox.refused_settings import refusing_client_settings
from outbox.service_health import Health

log = logging.getLogger("checker")


class Checker:
    """One checker instance: ``run()`` blocks until ``close()``."""

    def __init__(self, settings: CheckerSettings, *, clock: BrokerClock | None = None) -> None:
        self.settings = settings
        #: The broker's time, which the checks' deadlines and the producers' heartbeats are
        #: measured on (:class:`outbox.broker_clock.BrokerClock`, fed by the sessions' reads).
        self.clock = clock or BrokerClock()
        self.names = settings.topics
        tracing.load()  # the OpenTelemetry API, if installed (checker.tracing)
        self.stats = CheckerStats()
        #: The current session's tracker (a new one per session; read by the metrics).
        self.tracker = self.new_tracker()
        secret = settings.secret.encode() if settings.secret else None
        self.client = CheckClient(
            secret, settings.request_timeout_s, max_request_bytes=settings.request_max_bytes
        )
        self.refusals = Refusals()
        self.health = Health("checker")
        self.sessions = 0
        #: Which producer instances are live (the registry's reader). It outlives a session: a
        #: session that fails during a registry outage (its group coordinator on the same broker,
        #: say) must not forget the outage - a new reader knew nothing of it, so readiness no
        #: longer said how long the registry had been away, and once it was back, checks went
        #: out at once, without the grace after a lapse for the heartbeats the producers could
        #: not write (:mod:`checker.registry_currency`). Each new session renews its clients.
        self.instances: LiveInstances | None = None
        self._closed = threading.Event()
        self.breakers: dict[str, Breaker] = defaultdict(
            lambda: Breaker(
                min_samples=settings.breaker_min_samples,
                threshold=settings.breaker_threshold,
                cooldown_s=settings.breaker_cooldown_s,
            )
        )

    def new_tracker(self) -> Tracker:
        return Tracker(
            timeout_ms=int(self.settings.transaction_timeout_s * 1000),
            interval_ms=int(self.settings.check_interval_s * 1000),
            slack_ms=int(self.settings.clock_slack_s * 1000),
        )

    def close(self) -> None:
        self._closed.set()

    def run(self) -> None:
        """Check until :meth:`close`, a new session after each failed one.

        Raises:
            ConfigurationError: librdkafka or the brokers refuse a ``kafka`` setting for good
                (:mod:`outbox.refused_settings`): no new session would pass it.
            ForkedWithLockHeldError: this process was forked with a lock held that its Kafka
                clients need (:mod:`outbox.fork_checks`): replace the process.
        """
        check_if_forked()  # first, not as a failed session: every session then passes it
        try:
            self._sessions()
        finally:
            instances, self.instances = self.instances, None
            if instances is not None:
                instances.close()

    def _sessions(self) -> None:
        while not self._closed.is_set():
            self.health.touch()  # a session starting is the loop turning
            self.sessions += 1
            self.tracker = self.new_tracker()
            refused: str | None = None  # a setting no new session passes
            try:
                self._new_session().run()
            except ConfigurationError as err:
                refused = str(err)
            except (Restart, RoundFailed, KafkaException, OutboxError) as err:
                self.health.set_ready(False, f"restarting after: {err}")
                log.error("checker session ended (%s); starting a new one", err)
                self._closed.wait(1.0)
            if refused is not None:  # raised here, as text: nothing keeps the session's clients
                self.health.set_ready(False, refused)
                raise ConfigurationError(refused)

    def _new_session(self) -> Session:
        """A session's clients are made anew each time (the registry reader's too, its view
        kept): settings librdkafka refuses to make them of are refused for good
        (:mod:`outbox.refused_settings`)."""
        with refusing_client_settings(ENV_PREFIX):
            if self.instances is None:
                self.instances = LiveInstances(
                    self.settings.client_config,
                    self.names.registry,
                    self.settings.registry_ttl_s,
                    clock=self.clock,
                )
            else:
                self.instances.renew()
            return Session(
                self.settings,
                self.tracker,
                client=self.client,
                refusals=self.refusals,
                breakers=self.breakers,
                stats=self.stats,
                instances=self.instances,
                health=self.health,
                closed=self._closed,
                clock=self.clock,
            )

    @property
    def closed(self) -> threading.Event:
        """Set once :meth:`close` was called."""
        return self._closed

    def idle_s(self) -> float:
        """Seconds since the loop last turned (or a session start moved on)."""
        return self.health.idle_s()

    def live(self) -> tuple[bool, str]:
        """Liveness: the loop turns (a check round is bounded by the request timeouts)."""
        return self.health.live(self.settings.liveness_limit_s)

    def ready(self) -> tuple[bool, str]:
        """Ready once every assigned partition was read to its end since it was assigned,
        and while the registry topic was read to its end lately (which producer instances are
        live is known: :mod:`checker.registry_currency`)."""
        return self.health.ready()

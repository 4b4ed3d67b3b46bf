"""The relay: promotes committed half messages to their real topics, exactly once.

Each batch is ONE Kafka transaction holding the promoted records, the put-back copies, the dead
letters, and the relay's progress on the half and op partitions (``send_offsets_to_transaction``
with the consumer group's metadata, so an instance that lost its partitions in a rebalance is
fenced and cannot commit). A ``read_committed`` consumer of a real topic therefore sees each
committed message once, whatever happens to relays and brokers: either the batch committed with
its progress, or neither happened and the batch is redone from the committed progress.

Instances in one consumer group share the partitions. Both topics are subscribed with the range
assignor and have equal partition counts, so one instance owns partition p of both.

This module is the service: its life cycle, its HTTP endpoint, and the sessions it runs one
after another (:mod:`relay.session`). The parts that outlive a session are made here and
handed to each one.
"""

from __future__ import annotations

import logging
import threading

from confluent_kafka import KafkaException

from outbox import tracing
from outbox.broker_clock import BrokerClock
from outbox.errors import ConfigurationError, OutboxError
from outbox.fork_checks import check_if_forked
from outbox.refused_settings import refusing_client_settings
from outbox.service_health import Health
from outbox.service_http import ServiceEndpoint
from relay.accounting import Accounting
from relay.clients import admin_config
from relay.flow_control import FlowControl
from relay.log_ends import LogEnds
from relay.metrics import RelayMetrics
from relay.partitions import Partitions
from relay.refusals import Refusals
from relay.restart import Restart
from relay.session import Session
from relay.settings import ENV_PREFIX, RelaySettings
from relay.state import PartitionState
from relay.topic_cache import TopicCache
from relay.writer import Writer

log = logging.getLogger("relay")


class Relay:
    """One relay instance: ``run()`` blocks until ``close()``.

    Args:
        settings: what the instance needs.
        flow_control: how reading the op partitions pauses and resumes. Defaults to a
            :class:`FlowControl` with ``settings.max_queued_ops``.
        clock: the broker's time, for the put-back of pending transactions
            (:class:`outbox.broker_clock.BrokerClock`, which the relay feeds from its reads).
    """

    def __init__(
        self,
        settings: RelaySettings,
        *,
        flow_control: FlowControl | None = None,
        clock: BrokerClock | None = None,
    ) -> None:
        self.settings = settings
        self.names = settings.topics
        tracing.load()  # the OpenTelemetry API, if installed (relay.tracing)
        self.sessions = 0
        self.partitions = Partitions()
        self.health = Health("relay")
        self.accounting = Accounting(self.names, self.partitions)
        self.refusals = Refusals(settings.park_retry_s)
        self.ends = LogEnds(self.names.half)
        self.writer = Writer(self.names, self.ends, group_id=settings.group_id)
        self.flow_control = flow_control or FlowControl(self.names.op, settings.max_queued_ops)
        self.clock = clock or BrokerClock()
        self.metrics = RelayMetrics(self.accounting, self.partitions, self.clock)
        self._closed = threading.Event()
        self._http: ServiceEndpoint | None = None
        self._topics: TopicCache | None = None  # made by the first session, kept after it
        self._failure: str | None = None  # why the last session ended, if it failed

    # -- life cycle ------------------------------------------------------------------------

    def run(self) -> None:
        """Promote until :meth:`close`, a new session after each failed one.

        Raises:
            ConfigurationError: librdkafka or the brokers refuse a ``kafka`` setting for good
                (:mod:`outbox.refused_settings`): no new session would pass it.
            ForkedWithLockHeldError: this process was forked with a lock held that its Kafka
                clients need (:mod:`outbox.fork_checks`): replace the process.
        """
        check_if_forked()  # first (before the endpoint binds): every session then passes it
        if self.settings.http_port and self._http is None:
            self._http = ServiceEndpoint(
                live=self.live,
                ready=self.ready,
                metrics=self.metrics.render,
                host=self.settings.http_host,
                port=self.settings.http_port,
                name="outbox-relay-http",
            )
        stopped: str | None = "stopped"  # what readiness says once run() returns or raises
        try:
            while not self._closed.is_set():
                if not self._session():
                    self._closed.wait(self.settings.retry_backoff_s)
        except ConfigurationError:
            stopped = None  # readiness says the setting
            raise
        except BaseException as err:
            stopped = f"stopped after: {err!r}"
            raise
        finally:
            if stopped is not None:
                self.health.set_ready(False, stopped)
            if self._http is not None:
                self._http.close()
                self._http = None

    def _session(self) -> bool:
        """One session; False when it ended in a failure (the next one starts after a pause).

        The failure is let go of before the pause: its traceback holds the session's clients.
        """
        self.sessions += 1
        refused: str | None = None  # a setting no new session passes (outbox.refused_settings)
        try:
            if self._topics is None:
                with refusing_client_settings(ENV_PREFIX):  # its admin client: the first made
                    self._topics = TopicCache(
                        admin_config(self.settings),
                        refresh_s=self.settings.topic_refresh_s,
                        auto_create=self.settings.auto_create_topics,
                        auto_create_partitions=self.settings.auto_create_partitions,
                        touch=self.health.touch,
                    )
            Session(
                self.settings,
                self.partitions,
                closed=self._closed,
                writer=self.writer,
                refusals=self.refusals,
                ends=self.ends,
                flow_control=self.flow_control,
                accounting=self.accounting,
                health=self.health,
                commit_seconds=self.metrics.commit_seconds,
                clock=self.clock,
                topics=self._topics,
                after_failure=self._failure,
            ).run()
            self._failure = None
        except ConfigurationError as err:
            refused = str(err)
        except (Restart, KafkaException, OutboxError) as err:
            self.health.set_ready(False, f"restarting after: {err}")
            # as text: a log record a handler keeps must not keep the traceback (and with it
            # the session's clients) alive
            log.error("relay session ended (%s); starting a new one", str(err))
            self._failure = str(err)  # said while the next session settles
            return False
        if refused is not None:  # raised here, as text: nothing keeps the session's clients
            self.health.set_ready(False, refused)
            raise ConfigurationError(refused)
        return True

    def close(self) -> None:
        """Ask ``run()`` to finish the open batch (within the grace period) and return."""
        self._closed.set()

    @property
    def closed(self) -> threading.Event:
        """Set once ``close()`` was called."""
        return self._closed

    def idle_s(self) -> float:
        """Seconds since the loop last turned (or a session start or rebuild step moved on)."""
        return self.health.idle_s()

    def live(self) -> tuple[bool, str]:
        return self.health.live(self.settings.liveness_timeout_s)

    def ready(self) -> tuple[bool, str]:
        return self.health.ready()

    # -- views -----------------------------------------------------------------------------

    @property
    def states(self) -> dict[int, PartitionState]:
        """The partition pairs held now, by number."""
        return self.partitions.states

    @property
    def assigned(self) -> tuple[frozenset[int], frozenset[int]]:
        """(half partitions, op partitions) of the last assignment, as the group gave them."""
        return self.partitions.assigned

    @property
    def aborts(self) -> int:
        """Kafka transactions aborted."""
        return self.accounting.aborts

    @property
    def dead_lettered(self) -> int:
        """Dead letters in committed Kafka transactions: one for each rejected op and each
        undecodable record."""
        return self.accounting.dead_lettered

    def totals(self) -> dict[str, int]:
        """Counters over this instance's life, as of its last committed Kafka transaction."""
        return self.accounting.totals()

    def lag(self) -> dict[tuple[str, int], int]:
        """Lag as of the loop's last look."""
        return self.accounting.lag()

    def stats(self) -> dict[str, int]:
        """Totals plus what is held now."""
        states = list(self.states.values())
        return {
            **self.totals(),
            "pending": sum(s.pending_records for s in states),
            "held": sum(s.held for s in states),
            "parked": sum(len(s.parked) for s in states),
            "dead_lettered": self.dead_lettered,
            "aborts": self.aborts,
            "sessions": self.sessions,
        }

    def assignment(self) -> list[int]:
        return sorted(self.states)

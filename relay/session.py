"""One relay session: a transactional producer and a consumer of the half and op topics, from
``init_transactions`` (a new producer epoch, which fences the last session's) until the relay
closes or the clients cannot go on (:class:`relay.restart.Restart`).

The loop consumes, routes what it read into the partitions' states, keeps the op partitions'
read-ahead bounded, and commits a batch - one Kafka transaction - whenever enough was read, the
commit interval passed, or the relay caught up.
"""

from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import Consumer
from prometheus_client import Histogram

from outbox import kafka_clients
from outbox.broker_clock import BrokerClock
from outbox.closing import close_each
from outbox.fetch import HalfFetcher
from outbox.reading import consume_ready
from outbox.refused_settings import RefusedSettings, refusing_client_settings
from outbox.service_health import Health
from outbox.watermarks import Watermarks
from relay.accounting import Accounting
from relay.batch import BatchCommitter
from relay.clients import base_config, consumer_config, producer_config
from relay.flow_control import FlowControl
from relay.log_ends import LogEnds
from relay.op_retention import from_op_log_start
from relay.partitions import Partitions
from relay.readiness import GroupReadiness
from relay.rebalance import Rebalance
from relay.rebuild import OpHistory, Rebuilder
from relay.refusals import Refusals
from relay.restart import Restart
from relay.routing import Router
from relay.settings import ENV_PREFIX, RelaySettings
from relay.topic_cache import TopicCache
from relay.writer import Writer

log = logging.getLogger("relay")

#: How often the loop measures its lag for ``/metrics``.
LAG_EVERY_S = 2.0


class Session:
    """One session's Kafka clients and loop, over the relay's lasting parts."""

    def __init__(
        self,
        settings: RelaySettings,
        partitions: Partitions,
        *,
        closed: threading.Event,
        writer: Writer,
        refusals: Refusals,
        ends: LogEnds,
        flow_control: FlowControl,
        accounting: Accounting,
        health: Health,
        commit_seconds: Histogram,
        clock: BrokerClock,
        topics: TopicCache,
        after_failure: str | None = None,
    ) -> None:
        """``topics``: the relay's, kept across sessions: what it learnt of the real topics
        (which exist, which it may write to) outlives a session's clients. ``after_failure``:
        why the last session failed, if it did (readiness says it while this one settles:
        :mod:`relay.readiness`)."""
        self.settings = settings
        self.names = settings.topics
        self.partitions = partitions
        self.closed = closed
        self.writer = writer
        self.refusals = refusals
        self.ends = ends
        self.flow_control = flow_control
        self.accounting = accounting
        self.health = health
        self.commit_seconds = commit_seconds
        self.clock = clock
        self.topics = topics
        self.after_failure = after_failure

    def run(self) -> None:
        """Until ``closed`` is set (the open batch is committed first) or the clients fail.

        Raises:
            Restart, KafkaException, OutboxError: the session cannot go on.
        """
        settings = self.settings
        self.health.touch()
        config = base_config(settings)
        with refusing_client_settings(ENV_PREFIX):  # made anew each session: refused for good
            producer = kafka_clients.producer(producer_config(settings))
            history = OpHistory(config, self.names.op)
            fetcher = HalfFetcher(config, self.names.half)
            watermarks = Watermarks(config)
        topics = self.topics
        rebuilder = Rebuilder(
            history, settings, self.health.touch, config=config, watermarks=watermarks
        )
        rebalance = Rebalance(
            settings,
            self.partitions,
            rebuild=from_op_log_start(self.names.op, rebuilder.rebuild),
            flow_control=self.flow_control,
            ends=self.ends,
            accounting=self.accounting,
        )
        consumer: Consumer | None = None
        router: Router | None = None
        try:
            producer.init_transactions(settings.transaction_timeout_s * 3)
            self.health.touch()
            member_config = consumer_config(settings)
            with refusing_client_settings(ENV_PREFIX):
                consumer = kafka_clients.consumer(member_config)
            consumer.subscribe(
                [self.names.half, self.names.op],
                on_assign=rebalance.on_assign,
                on_revoke=rebalance.on_revoke,
                on_lost=rebalance.on_lost,
            )
            refused = RefusedSettings(member_config, ENV_PREFIX)
            router = Router(consumer, self.names, self.partitions, refused, settings.group_id)
            readiness = GroupReadiness(
                self.health, self.partitions, router.errors, after_failure=self.after_failure
            )
            batches = BatchCommitter(
                settings,
                self.partitions,
                producer=producer,
                consumer=consumer,
                fetcher=fetcher,
                watermarks=watermarks,
                topics=topics,
                writer=self.writer,
                refusals=self.refusals,
                ends=self.ends,
                accounting=self.accounting,
                health=self.health,
                commit_seconds=self.commit_seconds,
                clock=self.clock,
                committed=readiness.committed,
            )
            self._loop(consumer, rebalance, router, batches, readiness)
        finally:
            if router is not None:
                router.errors.flush()  # the consumer errors counted, not yet logged
            rebalance.close()
            self.flow_control.clear()
            close_each(
                (
                    None if consumer is None else consumer.close,
                    history.close,
                    fetcher.close,
                    watermarks.close,
                ),
                log,
            )
            # the producer's librdkafka handle goes with the object

    def _loop(
        self,
        consumer: Consumer,
        rebalance: Rebalance,
        router: Router,
        batches: BatchCommitter,
        readiness: GroupReadiness,
    ) -> None:
        settings = self.settings
        route = router.route
        last = time.monotonic()
        read = 0
        while not self.closed.is_set():
            self.health.touch()
            messages = consume_ready(consumer, settings.batch_max_records, settings.poll_timeout_s)
            if rebalance.callback_error is not None:
                err, rebalance.callback_error = rebalance.callback_error, None
                raise Restart(f"cannot take the assigned partitions: {err}") from err
            for msg in messages:
                route(msg)
            router.errors.tick()  # a stopped consumer error's count, a minute on
            readiness.update(rebalance.assignments, rebalance.given_nothing)
            self.clock.read(messages)
            read += len(messages)
            self.flow_control.update(consumer, self.partitions.states)
            now = time.monotonic()
            caught_up = read > 0 and len(messages) < settings.batch_max_records
            if (
                read >= settings.batch_max_records
                or now - last >= settings.commit_interval_s
                or (caught_up and settings.commit_when_caught_up)
            ):
                batches.commit()
                last, read = time.monotonic(), 0
            if now - self.accounting.lag_at >= LAG_EVERY_S:
                self.accounting.measure_lag(consumer, now)
        batches.commit(timeout=settings.shutdown_grace_s)

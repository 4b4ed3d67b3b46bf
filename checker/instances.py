"""Live producer instances per group, from the compacted registry topic."""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from checker.registry_currency import RegistryCurrency
from outbox import kafka_clients
from outbox.broker_clock import BrokerClock
from outbox.closing import close_each
from outbox.errors import ProtocolError
from outbox.protocol.registry import Registration, decode_registration
from outbox.watermarks import Watermarks

log = logging.getLogger("checker")

#: How often a refused registry is asked again (:meth:`LiveInstances._ask_again`).
ASK_AGAIN_S = 5.0
#: Records a consume call takes, and how long one poll goes on reading full batches.
BATCH, POLL_BUDGET_S = 1000, 0.5
#: How long a poll reads on toward the end its question was answered with.
CONFIRM_BUDGET_S = 0.5

#: Kafka's answers that the registry cannot be read as configured (not a broker away).
REFUSED = frozenset(
    {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._UNKNOWN_PARTITION,
    }
)


class LiveInstances:
    """Reads the registry topic from its start; an instance is live while its heartbeat is fresh:
    its broker stamp within ``ttl_s`` of ``clock``'s now, which these reads keep current.

    "No live instance" is only known once the registry was read to its end, while Kafka
    does not refuse it, and while the view is current (:attr:`unread`). A registry the checker's
    principal may not read (an ACL left out: it is the one internal topic the checker only
    reads) used to fail silently: every group looked gone, and its transactions were given up
    after ``no_producer_timeout_s``, a live producer's committed ones among them. So did one
    whose partition lost its leader while the rest of Kafka served
    (:mod:`checker.registry_currency`).
    """

    def __init__(
        self,
        config: dict[str, Any],
        topic: str,
        ttl_s: float,
        *,
        clock: BrokerClock | None = None,
    ) -> None:
        self.ttl_ms = int(ttl_s * 1000)
        self.currency = RegistryCurrency(topic, ttl_s)
        self.clock = clock or BrokerClock()
        self._seen: dict[bytes, tuple[Registration, int]] = {}
        self.topic = topic
        self._config = config
        self._next = 0  # the next offset to read
        self._consumer, self._watermarks = self._clients()
        self._at_end = False
        self._fetched = False  # a fetch answered (a record, or the end) since the last assign
        self._refused: str | None = None
        self._refused_code: int | None = None  # logged once a refusal, per cause
        self._stale = False  # refused since the last assign: what comes was fetched before
        self._asked_again = time.monotonic()  # not at start: a start reads on undisturbed

    def _clients(self) -> tuple[Consumer, Watermarks]:
        """The reader's consumer, assigned at the next offset to read, and the client that asks
        the registry's leader for its end: one that never fetches, so the question does not
        queue behind a fetch waiting for records (fetch.wait.max.ms), and of its own, so that a
        registry without a leader does not renew the reader's other client."""
        consumer = kafka_clients.consumer(
            {
                **self._config,
                "group.id": "outbox-checker-registry",
                "enable.auto.commit": False,
                "enable.partition.eof": True,  # read to its end: "none live" is known
                # an offset gone (DeleteRecords, a topic made again): from the start, not
                # from the end, which would look read through with nothing read
                "auto.offset.reset": "earliest",
            }
        )
        try:
            consumer.assign([TopicPartition(self.topic, 0, self._next)])
            return consumer, Watermarks(self._config)
        except BaseException:
            close_each((consumer.close,), log, "the registry reader's new consumer")
            raise

    def renew(self) -> None:
        """Read on from the next offset with new Kafka clients, the view kept (what was read,
        since when it is known read to its end, a lapse). Each new session of the checker does
        this: the reader outlives the sessions, whose clients are made anew, and a client broken
        without a word (a certificate rotated since it connected) is healed as theirs are."""
        old = (self._consumer.close, self._watermarks.close)
        self._consumer, self._watermarks = self._clients()
        self._fetched, self._stale = False, False  # as when assigned again (_ask_again)
        self.currency.renewed()
        close_each(old, log, "the registry reader's old Kafka clients")

    @property
    def unread(self) -> str | None:
        """Why which instances are live is not known now (None: it is): the registry is not
        read to its end yet, Kafka refuses it, or the view is not current
        (:attr:`RegistryCurrency.reason`: as of the loop's last :meth:`poll`, not of a worker
        thread's long check)."""
        if self._refused is not None:
            return f"the registry topic {self.topic} cannot be read ({self._refused})"
        if not self._at_end:
            return f"the registry topic {self.topic} is not read to its end yet"
        return self.currency.reason

    def poll(self) -> None:
        """Read what the registry has now: batches while they come full, for up to
        :data:`POLL_BUDGET_S` (a checker starting reads a week of heartbeats before it knows
        which instances are live; a batch a loop turn took minutes)."""
        if self._refused is not None or not self._at_end:
            self._ask_again()
        started = time.monotonic()
        while True:
            began = time.monotonic()
            messages = self._consumer.consume(BATCH, 0)
            self._read(messages)
            if len(messages) < BATCH:
                self.currency.drained(began)
                break
            if time.monotonic() - started > POLL_BUDGET_S:
                break
        self._confirm()
        self.currency.update(readable=self._refused is None and self._at_end)

    def _confirm(self) -> None:
        """Whether the records read have reached the end last asked, and the registry's leader
        asked for its end when due (:class:`RegistryCurrency`); an end past what was read is
        read up to for a moment (after a long turn of the loop, the end events taken from the
        queue are dated too early to keep the view current: the question does). Briefly: the
        loop waits, at most :data:`CONFIRM_BUDGET_S` and the question's timeout."""
        if self._refused is not None:
            return
        confirmed = self.currency.read_to(self._next)
        if self.currency.due():
            asked_at = self.currency.asking()
            try:
                _, end = self._watermarks.query(
                    self.topic, 0, timeout=min(2.0, self.currency.ask_every_s)
                )
            except KafkaException:
                end = None  # no leader, or no answer: the view lapses after current_s
            confirmed = self.currency.answered(asked_at, end, self._next) or confirmed
            deadline = time.monotonic() + CONFIRM_BUDGET_S
            while self.currency.pending() and time.monotonic() < deadline:
                self._read(self._consumer.consume(BATCH, 0.05))
                confirmed = self.currency.read_to(self._next) or confirmed
        # a question alone says nothing of whether Kafka lets this client read (Describe
        # answers it): only once a fetch was answered since the last assign
        if confirmed and self._fetched and not self._at_end:
            self._at_end = True  # a busy registry: librdkafka may never see an empty fetch

    def _read(self, messages: list[Message]) -> None:
        self.clock.read(messages)
        for msg in messages:
            key, error = msg.key(), msg.error()
            if error is not None:
                self._error(error)
                continue
            if self._refused is not None and not self._stale:
                log.info("the checker reads the registry topic %s again", self.topic)
                self._refused = self._refused_code = None
            self._fetched = self._fetched or not self._stale
            self._next = (msg.offset() or 0) + 1
            if key is None:
                continue
            try:
                reg = decode_registration(msg.value())
            except ProtocolError as err:
                log.warning("unreadable registry record %r: %s", key, err)
                continue
            if reg is None:
                self._seen.pop(key, None)
            else:
                self._seen[key] = (reg, msg.timestamp()[1])

    def _ask_again(self) -> None:
        """Every few seconds while the registry is refused or not read to its end.

        librdkafka tells a refused fetch once, and that the registry is read to its end only
        on reaching a new end: once granted, an idle registry would say neither. Assigned
        again, it tells one or the other (what was fetched before the assign is dropped: a
        stale end cannot clear the refusal). A topic Kafka refuses to describe (no ACL at all)
        is refused in metadata, which librdkafka does not report for a partition it never
        read: asked here."""
        now = time.monotonic()
        if now - self._asked_again < ASK_AGAIN_S:
            return
        self._asked_again = now
        if self._refused is None:
            try:
                found = self._consumer.list_topics(self.topic, timeout=1).topics.get(self.topic)
            except KafkaException:
                return  # a broker away: nothing learnt
            if found is None or found.error is None:
                return  # readable as far as Kafka says: reading on
            self._error(found.error)
            if self._refused is None:
                return
        self._consumer.assign([TopicPartition(self.topic, 0, self._next)])
        self._fetched = False
        self.currency.forget()
        self._stale = False

    def _error(self, error: KafkaError) -> None:
        if error.code() == KafkaError._PARTITION_EOF:
            if self._stale:
                return  # fetched before the refusal: says nothing of now
            if self._refused is not None:
                log.info("the checker reads the registry topic %s again", self.topic)
            self._at_end, self._refused, self._refused_code = True, None, None
            self._fetched = True
            self.currency.reached_end()
            return
        if error.code() not in REFUSED:
            return  # a broker away: librdkafka reconnects, the view waits for fresh heartbeats
        # known again only once read to a fresh end: the first records after a refusal are
        # a backlog, its heartbeats stale; and an end fetched before the refusal says nothing
        self._at_end, self._stale = False, True
        self.currency.forget()
        if error.code() != self._refused_code:
            self._refused_code = error.code()
            log.error(
                "the checker cannot read the registry topic %s (%s): it does not know which "
                "producer instances are live, so it neither checks nor gives up transactions "
                "of groups it knows no live instance of until it can; %s",
                self.topic,
                error.str(),
                "grant the checker's principal Read on the topic"
                if error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
                else "create it with `kafka-outbox topics ensure`",
            )
        self._refused = error.str()

    def live(self, group: str, now_ms: int | None = None) -> list[Registration]:
        now_ms = self.clock.now_ms() if now_ms is None else now_ms
        return [
            r
            for r, seen in self._seen.values()
            if r.group == group and now_ms - seen <= self.ttl_ms
        ]

    def pick(self, group: str, n: int, now_ms: int | None = None) -> list[Registration]:
        """Up to ``n`` live instances in random order: the first is asked, the rest fail over."""
        live = self.live(group, now_ms)
        random.shuffle(live)
        return live[:n]

    def close(self) -> None:
        close_each((self._consumer.close, self._watermarks.close), log, "the registry's reader")

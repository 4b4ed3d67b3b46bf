"""Writing a batch's actions into the open Kafka transaction, and what the delivery reports say.

Promotions go to their real topics, put-back copies to the half partition they came from (with
``outbox-origin-offset``), rejected ops and undecodable records to the dead-letter topic. A write
refused for what it is (:func:`relay.refusals.refuses_the_record`) is noted, and the abort that
follows settles it: a promoted record's transaction is parked (:mod:`relay.refusals`), a dead
letter is written again without the original key, value and headers, and a transaction whose
put-back copy the half topic refused is never put back again (it stays pending where it is).
State records (a parked COMMIT remembered, or forgotten) go to the state topic's partition of the
same number as the half partition.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from outbox.logs import fields
from outbox.protocol.copies import copy_headers
from outbox.protocol.dead_letter import DeadLetterHeader
from outbox.protocol.op import encode_op
from outbox.protocol.state import Parked, StateKey, StateOwner, encode_state
from outbox.protocol.topics import TopicNames
from relay.actions import Action, BadRecord, Drop, Promote, PutBack, Reject, Remember
from relay.log_ends import LogEnds
from relay.promotion import Headers, Outgoing, dead_letter, promoted, promoted_headers
from relay.refusals import Failure, refuses_the_record

log = logging.getLogger("relay")

#: A dead letter's source record: (topic, partition, offset).
Source = tuple[str, int, int]


class Writer:
    """Produces actions' records; remembers what was refused across batches and sessions."""

    def __init__(self, names: TopicNames, ends: LogEnds, *, group_id: str) -> None:
        self.names = names
        self.ends = ends
        #: The relays' consumer group: state records are keyed by it.
        self.group_id = group_id
        #: Writes refused in the open Kafka transaction (parked once it is aborted).
        self.failures: list[Failure] = []
        #: Dead letters refused for what they carry, by source (topic, partition, offset):
        #: written again without the original key, value and headers.
        self.letters_refused: dict[Source, str] = {}
        #: Transactions whose put-back copies the half topic refused (too large once the
        #: origin header is added): never put back; they stay pending where they are.
        self.unmovable: set[str] = set()

    def begin(self) -> None:
        """A Kafka transaction begins: nothing of it was refused yet."""
        self.failures = []

    def refused(self, producer: Producer) -> list[Failure]:
        """The writes the failed Kafka transaction was refused, once the abort settled them.

        A refusal fails the transaction call as soon as the broker answers; the reports a
        failed call left queued are served here first.
        """
        try:
            producer.poll(0)
        except KafkaException as err:  # a report callback's own failure: keep what was noted
            log.warning("serving the failed batch's delivery reports: %s", err)
        failures, self.failures = self.failures, []
        return failures

    # -- actions ---------------------------------------------------------------------------

    def emit(self, producer: Producer, partition: int, action: Action) -> None:
        if isinstance(action, Promote):
            self._promote(producer, action)
        elif isinstance(action, PutBack):
            txn_id = action.records[0].txn_id
            on_copied = functools.partial(self._copied, txn_id)
            on_refused = functools.partial(self._stays, txn_id)
            for record in action.records:
                copy = Outgoing(
                    self.names.half,
                    record.txn_id.encode(),
                    record.message.value,
                    list(copy_headers(record)),
                    partition=partition,
                )
                self._produce(producer, copy, on_copied, on_refused=on_refused)
        elif isinstance(action, Reject):
            self._reject(producer, action)
        elif isinstance(action, BadRecord):
            source = (action.topic, action.partition, action.offset)
            headers: Headers = list(action.headers)
            self._dead_letter(producer, action.reason, source, action.key, action.value, headers)
        elif isinstance(action, Remember):
            value = None if action.op is None else Parked(action.op)
            key, data = encode_state(
                StateKey(StateOwner.RELAY, self.group_id, action.txn_id), value
            )
            state = Outgoing(self.names.state, key, data, [], partition=partition)
            self._produce(producer, state, self._delivered_state)
        else:
            assert isinstance(action, Drop)

    def _promote(self, producer: Producer, action: Promote) -> None:
        """The fast path of :meth:`_produce` for promoted records: produced straight from the
        half records, no :class:`relay.promotion.Outgoing` in between; a full local queue or a
        refused record goes the general way (the record was not queued, so it is produced
        once)."""
        txn_id = action.op.txn_id
        # A delivery report carries no headers (confluent-kafka), so the transaction a
        # refused record belongs to rides in its callback: one per transaction.
        on_delivery = functools.partial(self._delivered, txn_id)
        produce = producer.produce
        for record in action.records:
            message = record.message
            try:
                produce(
                    message.topic,
                    message.value,
                    message.key,
                    -1,
                    on_delivery,
                    headers=promoted_headers(record),
                )
            except (BufferError, KafkaException):
                self._produce(producer, promoted(record), on_delivery, txn_id)

    def _reject(self, producer: Producer, action: Reject) -> None:
        op = action.op
        reason = f"{op.state.value} op at offset {op.offset} for {op.txn_id}: {action.reason}"
        log.error(
            "dead-lettering: %s",
            reason,
            extra=fields(
                txn_id=op.txn_id,
                group=op.producer_group,
                topic=self.names.op,
                partition=op.partition,
                offset=op.offset,
            ),
        )
        key, value = encode_op(op)
        source = (self.names.op, op.partition, op.offset)
        self._dead_letter(producer, reason, source, key, value, None)

    def _dead_letter(
        self,
        producer: Producer,
        reason: str,
        source: Source,
        key: bytes | None,
        value: bytes | None,
        headers: Headers | None,
    ) -> None:
        topic, partition, offset = source
        refused = self.letters_refused.pop(source, None)
        if refused is not None:
            omitted = (
                f"the dead-letter topic refused the original key, value and headers ({refused});"
                f" read them at {topic}[{partition}] offset {offset} while its retention lasts"
            )
            key, value, headers = None, None, [(DeadLetterHeader.OMITTED.value, omitted)]
        letter = dead_letter(
            self.names.dead_letter,
            reason=reason,
            source_topic=topic,
            source_partition=partition,
            source_offset=offset,
            key=key,
            value=value,
            headers=headers,
        )
        self._produce(
            producer,
            letter,
            functools.partial(self._dead_letter_delivered, source),
            on_refused=functools.partial(self._letter_refused, source),
        )

    def _produce(
        self,
        producer: Producer,
        out: Outgoing,
        on_delivery: Callable[[KafkaError | None, Message], None],
        txn_id: str | None = None,
        on_refused: Callable[[KafkaError], None] | None = None,
    ) -> None:
        """Queue one record of the open Kafka transaction (the hot path: no per-record
        closure, positional arguments).

        Raises:
            KafkaException: the client refused the record before sending it (bigger than its
                ``message.max.bytes``); noted against ``txn_id``, which the abort then parks,
                and handed to ``on_refused`` (the same handler its delivery report uses).
        """
        partition = -1 if out.partition is None else out.partition  # -1: the partitioner
        while True:
            try:
                producer.produce(
                    out.topic, out.value, out.key, partition, on_delivery, headers=out.headers
                )
                return
            except BufferError:
                producer.poll(0.05)  # local queue full: let deliveries drain
            except KafkaException as err:
                if refuses_the_record(err.args[0]):
                    self.failures.append((txn_id, f"{out.topic}: {err.args[0].str()}"))
                    if on_refused is not None:
                        on_refused(err.args[0])
                raise

    # -- delivery reports (served by the producer's poll and flush) ------------------------

    def _delivered(self, txn_id: str | None, err: KafkaError | None, msg: Message) -> None:
        """A promoted record's report: a refusal is noted against its transaction, which
        :meth:`relay.refusals.Refusals.park` parks once the batch is aborted."""
        if err is not None and refuses_the_record(err):
            self.failures.append((txn_id, f"{msg.topic()}: {err.str()}"))

    def _delivered_state(self, err: KafkaError | None, msg: Message) -> None:
        self._delivered(None, err, msg)

    def _dead_letter_delivered(self, source: Source, err: KafkaError | None, msg: Message) -> None:
        if err is not None and refuses_the_record(err):
            self._letter_refused(source, err)
        self._delivered(None, err, msg)

    def _letter_refused(self, source: Source, err: KafkaError) -> None:
        """The dead letter of ``source`` is redone (its batch aborts) without the original."""
        self.letters_refused[source] = err.str()

    def _copied(self, txn_id: str, err: KafkaError | None, msg: Message) -> None:
        """A put-back copy's report: past its offset is where the half partition ends."""
        if err is not None:
            if refuses_the_record(err):
                self._stays(txn_id, err)
            self._delivered(None, err, msg)
            return
        self.ends.copied(int(msg.partition() or 0), int(msg.offset() or 0) + 1)

    def _stays(self, txn_id: str, err: KafkaError) -> None:
        if txn_id not in self.unmovable:
            log.error(
                "transaction %s: the half topic refused its put-back copy (%s); it stays "
                "pending where it is, and the committed half offset waits for its decision",
                txn_id,
                err.str(),
                extra=fields(txn_id=txn_id),
            )
        if len(self.unmovable) > 100_000:
            self.unmovable.clear()
        self.unmovable.add(txn_id)

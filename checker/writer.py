"""Everything a checker writes, one Kafka transaction per round, with its read positions.

Decisions (op records), dead-letter copies of given-up transactions and check counts (state
records) go out together with the checker's consumer offsets, committed through
``send_offsets_to_transaction`` with the consumer group's metadata. So a checker instance that
lost its partitions while frozen (a zombie: SIGSTOP, a partition from its group, a loop stalled
past ``max.poll.interval.ms``) cannot write a decision after the new owner took over: its
transaction is fenced, as the relay's are (KIP-447). Either the whole round is written with
the positions that make it true, or none of it is, and the next session starts again from the
committed positions.

A record the broker refuses for itself (an op or dead letter over its topic's
``max.message.bytes``) aborts the round; the writer remembers it so the next session does not
fail the same way forever: a refused op's transaction is left undecided for a check interval
and checked again, a refused dead letter is written again without the original record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition

from checker.plan import RoundPlan
from outbox import kafka_clients
from outbox.protocol.dead_letter import DeadLetterHeader, dead_letter_headers
from outbox.protocol.half import HalfRecord
from outbox.protocol.op import OpRecord, encode_op
from outbox.protocol.state import CheckCount, StateKey, StateOwner, encode_state
from outbox.protocol.topics import TopicNames

log = logging.getLogger("checker")

#: Errors that refuse a record for what it is (it would be refused again as it is).
REFUSALS = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_MSG,
        KafkaError.POLICY_VIOLATION,
    }
)


class RoundFailed(Exception):
    """The round's Kafka transaction did not commit (aborted, or the producer is fenced)."""


@dataclass
class Refusals:
    """What the broker refused, kept across sessions (the writer is rebuilt with each)."""

    #: Transaction id -> when its op was refused: the next attempt waits a check interval.
    ops: dict[str, float] = field(default_factory=dict)
    #: (partition, source offset) of half records whose dead-letter copy was refused, and how
    #: many times: written again without the value, then without the original headers too.
    letters: dict[tuple[int, int], tuple[int, str]] = field(default_factory=dict)

    def op_refused(self, txn_id: str) -> bool:
        """Whether the transaction's op was refused since its last attempt (forgotten now: the
        attempt after the next check interval writes it again)."""
        return self.ops.pop(txn_id, None) is not None


class RoundWriter:
    """Writes one round (see the module docstring) through a transactional producer."""

    def __init__(
        self,
        config: dict[str, Any],
        names: TopicNames,
        group_id: str,
        transactional_id: str,
        refusals: Refusals,
        *,
        timeout_s: float = 30.0,
        progress: Callable[[], None] = lambda: None,
    ) -> None:
        self.names = names
        self.group_id = group_id
        self.refusals = refusals
        self.timeout_s = timeout_s
        self._handle: Producer | None = kafka_clients.producer(
            {
                **config,
                "transactional.id": transactional_id,
                "transaction.timeout.ms": int(timeout_s * 1000),
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
            }
        )
        init_transactions(self._producer, timeout_s, progress=progress)
        self._open = False
        self._refused: list[tuple[str, str, Callable[[str], None]]] = []

    @property
    def _producer(self) -> Producer:
        if self._handle is None:
            raise RoundFailed("the round writer is closed")
        return self._handle

    def write(self, plan: RoundPlan, offsets: list[TopicPartition], group_metadata: Any) -> None:
        """Write ``plan`` and commit the consumer positions ``offsets`` with it.

        Raises:
            RoundFailed: the round was aborted (refusals noted) or could not be.
        """
        self._refused = []
        try:
            self._producer.begin_transaction()
            self._open = True
            for op in plan.ops:
                self.op(op)
            for record, reason in plan.letters:
                self.dead_letter(record, reason)
            for partition, txn_id, count in plan.states:
                self.state(partition, txn_id, count)
            self._producer.send_offsets_to_transaction(offsets, group_metadata, self.timeout_s)
            self._producer.commit_transaction(self.timeout_s)
        except KafkaException as err:
            self._abort(err.args[0])
        finally:
            self._open = False

    def op(self, op: OpRecord) -> None:
        key, value = encode_op(op)

        def refused(why: str) -> None:
            self.refusals.ops[op.txn_id] = time.monotonic()

        self._produce(self.names.op, key, value, op.half_partition, None, refused)

    def dead_letter(self, record: HalfRecord, reason: str) -> None:
        """A copy of ``record`` with the reason; when its copy was refused before, without the
        value (then without the original headers too), saying where the record still is."""
        source = (record.partition, record.original_offset)
        times, why = self.refusals.letters.get(source, (0, ""))
        value: bytes | None = record.message.value if times == 0 else None
        original = record.raw_headers if times < 2 else ()
        headers = dead_letter_headers(
            original,
            reason=reason,
            source_topic=self.names.half,
            source_partition=record.partition,
            source_offset=record.original_offset,
        )
        if times:
            headers.append(
                (
                    DeadLetterHeader.OMITTED.value,
                    f"the dead-letter topic refused the original record ({why}); read it at "
                    f"{self.names.half}[{record.partition}] offset {record.original_offset} "
                    "while its retention lasts",
                )
            )

        def refused(why: str) -> None:
            self.refusals.letters[source] = (times + 1, why)

        self._produce(
            self.names.dead_letter,
            record.txn_id.encode(),
            value,
            record.partition,
            headers,
            refused,
        )

    def state(self, partition: int, txn_id: str, count: CheckCount | None) -> None:
        key, value = encode_state(StateKey(StateOwner.CHECKER, self.group_id, txn_id), count)
        self._produce(self.names.state, key, value, partition, None, None)

    def _abort(self, error: KafkaError) -> None:
        try:
            if not error.fatal():
                self._producer.abort_transaction(self.timeout_s)
        except KafkaException as err:
            log.warning("aborting the round's Kafka transaction: %s", err)
        self._producer.poll(0)  # the aborted records' reports: which were refused
        for topic, why, note in self._refused:
            log.error("the broker refused a record for %s (%s); not written this round", topic, why)
            note(why)
        raise RoundFailed(f"the round's Kafka transaction did not commit: {error.str()}")

    def _produce(
        self,
        topic: str,
        key: bytes,
        value: bytes | None,
        partition: int,
        headers: list[tuple[str, str | bytes | None]] | None,
        on_refused: Callable[[str], None] | None,
    ) -> None:
        def delivered(err: KafkaError | None, msg: Message) -> None:
            if err is not None and err.code() in REFUSALS and on_refused is not None:
                self._refused.append((topic, err.str(), on_refused))

        try:
            self._producer.produce(topic, value, key, partition, delivered, headers=headers or None)
        except KafkaException as err:
            if err.args[0].code() in REFUSALS and on_refused is not None:
                self._refused.append((topic, err.args[0].str(), on_refused))
            raise
        except BufferError:
            self._producer.poll(0.1)
            self._producer.produce(topic, value, key, partition, delivered, headers=headers or None)

    def close(self) -> None:
        """Abort an open round, wait up to 5 s for what is queued, and let go of the producer.

        Its librdkafka handle goes with it now: the session that holds this writer lives in
        reference cycles, which only the cyclic collector frees, some time later; until then the
        producer would stay connected and log a stopped broker's refused reconnects.
        """
        if self._handle is None:
            return
        if self._open:
            try:
                self._handle.abort_transaction(5)
            except KafkaException as err:
                log.warning("abort on close: %s", err)
        self._handle.flush(5)
        self._handle = None


def init_transactions(
    producer: Producer,
    timeout_s: float,
    attempts: int = 10,
    progress: Callable[[], None] = lambda: None,
) -> None:
    """``init_transactions``, retried while the coordinator still settles the previous
    session's transaction (CONCURRENT_TRANSACTIONS right after an abort is retriable).
    ``progress`` is called before each attempt: a retry is not a stuck loop (the watchdog's
    measure, :mod:`outbox.watchdog`), however long the coordinator takes."""
    for attempt in range(attempts):
        progress()
        try:
            producer.init_transactions(timeout_s)
            return
        except KafkaException as err:
            if not err.args[0].retriable() or attempt == attempts - 1:
                raise
            log.info("init_transactions: %s; retrying", err.args[0].str())
            time.sleep(0.2 * (attempt + 1))

"""Which COMMITs wait (are *parked*) instead of being promoted now, and when they are tried again.

A COMMIT is parked when a real topic of its records does not exist or the relay may not write to
it (the relay goes on with the other transactions, and retries it each batch) or refused a record
of it for what the record is (too large, invalid, not allowed): that refusal aborted a batch, and
the batch is redone without the transaction, which is retried after ``park_retry_s``. The broker
refuses a record batch as a whole, so transactions refused together are retried one a batch, the
longest refused first: the others get through, and the one at fault, refused again, goes to the
back of the line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from confluent_kafka import KafkaError

from outbox.logs import fields
from outbox.protocol.half import HalfRecord
from outbox.protocol.op import OpRecord
from relay.whole import topics_of

log = logging.getLogger("relay")

#: Errors that refuse a record for what it is, so that its transaction is parked. Any other
#: (a broker restarting, a timeout, records the abort dropped) fails the batch alone, which is
#: redone: parking those would let later transactions on the same key overtake.
_REFUSALS = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_MSG,
        KafkaError.INVALID_TIMESTAMP,
        KafkaError.POLICY_VIOLATION,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
    }
)

#: A write the open Kafka transaction was refused: (the transaction it belongs to, or None for
#: a dead letter or a put-back copy; "<topic>: <the broker's answer>").
Failure = tuple[str | None, str]


def refuses_the_record(error: KafkaError) -> bool:
    """Whether ``error`` refuses a record for what it is (its transaction gets parked)."""
    return error.code() in _REFUSALS


class Topics(Protocol):
    """Which real topics the relay can write to (:class:`relay.topic_cache.TopicCache`)."""

    def unwritable(self, topic: str) -> str | None:
        """None when the relay can write to ``topic``; else why not, and what to do."""
        ...


class Refusals:
    """Transactions a real topic refused, and the parking policy that holds them back.

    Lives as long as the relay: a refusal aborts the batch and ends the session, and the next
    session must go on without the transaction.
    """

    def __init__(self, park_retry_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.park_retry_s = park_retry_s
        self._clock = clock
        #: Transaction id -> when a real topic refused it.
        self.refused: dict[str, float] = {}
        # Refused transactions due for a retry, as seen by this batch; the next batch retries
        # the longest refused of them, alone (see _why_not).
        self._due: dict[str, float] = {}
        self._retry: str | None = None
        self._parked_logged: set[str] = set()
        # Each real topic's answer (:meth:`Topics.unwritable`) for the batch being taken: one
        # answer for all of a batch's questions, so the parked COMMITs, asked first, and those
        # read since agree on a topic whose condition clears (created, Write granted) while
        # the batch is taken; asked afresh at the next batch.
        self._answers: dict[str, str | None] = {}

    def begin_batch(self) -> None:
        """A new batch: it retries the longest refused of those the last one found due, and
        asks again whether each real topic can be written to."""
        self._retry = min(self._due, key=self._due.__getitem__) if self._due else None
        self._due = {}
        self._answers = {}

    def promotable(
        self, topics: Topics, op: OpRecord, records: tuple[HalfRecord, ...]
    ) -> str | None:
        """None when ``op``'s records can be written now, else why it stays parked (logged
        once for each time a transaction is parked)."""
        why = self._why_not(topics, op, records)
        if why is None:
            if self._parked_logged:
                self._parked_logged.discard(op.txn_id)
        elif op.txn_id not in self._parked_logged:
            if len(self._parked_logged) > 100_000:
                self._parked_logged.clear()
            self._parked_logged.add(op.txn_id)
            log.warning(
                "transaction %s parked: %s",
                op.txn_id,
                why,
                extra=fields(
                    txn_id=op.txn_id,
                    group=op.producer_group,
                    partition=op.half_partition,
                    offsets=op.half_offsets,
                ),
            )
        return why

    def still_parked(self, topics: Topics, op: OpRecord, names: tuple[str, ...]) -> str | None:
        """Why the parked ``op``, whose records write to the real topics ``names``, still
        waits (None: it may go now), asked before its records are read back by offset
        (:data:`relay.whole.StillParked`). Answers as :meth:`promotable` would, and counts the
        same way towards the order refused transactions are retried in."""
        return self._why_not_by_name(topics, op, names)

    def _why_not(self, topics: Topics, op: OpRecord, records: tuple[HalfRecord, ...]) -> str | None:
        # one record is the common case, once per promotion: no set, no sort
        names = (records[0].message.topic,) if len(records) == 1 else topics_of(records)
        return self._why_not_by_name(topics, op, names)

    def _why_not_by_name(self, topics: Topics, op: OpRecord, names: Iterable[str]) -> str | None:
        answers = self._answers
        for topic in names:
            if topic in answers:
                why = answers[topic]
            else:
                why = answers[topic] = topics.unwritable(topic)
            if why is not None:
                return why
        if not self.refused:
            return None
        refused = self.refused.get(op.txn_id)
        if refused is not None:
            # One a batch, the longest refused first: the broker refuses a record batch whole,
            # so transactions refused together are retried apart - the others get through,
            # and the one at fault, refused again, goes to the back.
            if self._clock() - refused < self.park_retry_s:
                return "its real topic refused a write; retried later"
            if op.txn_id != self._retry:
                self._due[op.txn_id] = refused
                return "its real topic refused a write; retried after those refused before it"
            del self.refused[op.txn_id]
            self._retry = None
        return None

    def park(self, failures: Iterable[Failure]) -> None:
        """Park each transaction a real topic refused a record of (the batch was aborted), so
        that the redone batch goes without it (until ``park_retry_s``) instead of failing the
        same way forever."""
        now = self._clock()
        for txn_id, why in failures:
            if txn_id is not None:
                self.refused[txn_id] = now
                log.error(
                    "transaction %s: its real topic refused a write (%s); parked",
                    txn_id,
                    why,
                    extra=fields(txn_id=txn_id),
                )
            else:  # a dead letter or a put-back copy: nothing to park, the batch is redone
                log.error(
                    "a write to an internal topic was refused (%s); redoing the batch (a "
                    "refused dead letter goes without the original record, a refused put-back "
                    "not at all)",
                    why,
                )

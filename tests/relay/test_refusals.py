"""Which produce errors park a transaction as refused, which only fail the batch, and in what
order refused transactions are retried (unit: a stand-in clock and topic list)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from outbox.protocol import DecidedBy, HalfMessage, HalfRecord, OpRecord, OpState
from relay.refusals import Refusals, refuses_the_record


@pytest.mark.parametrize(
    "code",
    [KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_RECORD, KafkaError.POLICY_VIOLATION],
)
def test_an_error_about_the_record_itself_parks_its_transaction(code: int) -> None:
    assert refuses_the_record(KafkaError(code))


@pytest.mark.parametrize(
    "code",
    [
        KafkaError._MSG_TIMED_OUT,  # the broker was away longer than message.timeout.ms
        KafkaError._TRANSPORT,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError._PURGE_QUEUE,  # dropped by the abort of a batch another record failed
        KafkaError._PURGE_INFLIGHT,
        KafkaError._STATE,  # produce() into a transaction that must be aborted
        KafkaError._FENCED,
    ],
)
def test_a_broker_or_transaction_failure_parks_nothing_so_per_key_order_holds(code: int) -> None:
    # Parking these would let later transactions on the same key overtake the parked one:
    # a broker restart under load did exactly that once (tests/relay/test_crashes.py).
    assert not refuses_the_record(KafkaError(code))


class Everything:
    """Every real topic exists, and the relay may write to it."""

    def unwritable(self, topic: str) -> str | None:
        return None


def commit(txn_id: str) -> tuple[OpRecord, tuple[HalfRecord, ...]]:
    record = HalfRecord(
        txn_id=txn_id,
        producer_group="g",
        message=HalfMessage(topic="orders", value=b"v"),
        index=0,
        count=1,
        created_at_ms=0,
        check_count=0,
        partition=0,
        offset=0,
        timestamp_ms=0,
    )
    op = OpRecord(txn_id, OpState.COMMIT, "g", 0, (0,), DecidedBy.PRODUCER, 0)
    return op, (record,)


def test_transactions_refused_together_are_retried_one_a_batch_the_longest_refused_first() -> None:
    # The broker refuses a record batch whole: the one at fault must not hold back the others.
    now = [100.0]
    refusals = Refusals(park_retry_s=30, clock=lambda: now[0])
    first, second = (
        commit("01a203d8-301f-7701-b6f4-468000000001"),
        commit("01a203d8-301f-7701-b6f4-468000000002"),
    )
    topics = Everything()
    # Given two transactions refused in one batch, the first a little earlier
    refusals.park([(first[0].txn_id, "orders: too large")])
    now[0] += 1
    refusals.park([(second[0].txn_id, "orders: too large"), (None, "a dead letter")])
    # Then both wait out park_retry_s
    refusals.begin_batch()
    assert refusals.promotable(topics, *first) is not None
    assert refusals.promotable(topics, *second) is not None
    # When it has passed, the next batch finds both due, and the one after retries the first
    now[0] += 30
    refusals.begin_batch()
    assert "retried after those refused before it" in str(refusals.promotable(topics, *first))
    assert "retried after those refused before it" in str(refusals.promotable(topics, *second))
    refusals.begin_batch()
    assert refusals.promotable(topics, *first) is None
    assert refusals.promotable(topics, *second) is not None
    # And the batch after that the second, alone
    refusals.begin_batch()
    assert refusals.promotable(topics, *second) is None
    assert refusals.refused == {}


def test_a_batch_has_one_answer_per_topic_even_when_its_condition_clears_meanwhile() -> None:
    """The topic cache refreshes inside whichever question first finds it due: a topic created
    while a batch is taken used to be missing for the parked COMMITs, asked first, and present
    for those read since, which then went first, on their keys too."""

    class Created:
        asked = 0

        def unwritable(self, topic: str) -> str | None:
            self.asked += 1
            return "topic orders does not exist" if self.asked == 1 else None

    refusals, topics = Refusals(park_retry_s=30), Created()
    parked, later = (commit(f"01a203d8-301f-7701-b6f4-46800000000{i}") for i in (1, 2))
    refusals.begin_batch()
    assert refusals.promotable(topics, *parked) is not None
    assert refusals.promotable(topics, *later) is not None  # the batch's answer, not a new one
    assert refusals.still_parked(topics, parked[0], ("orders",)) is not None
    assert topics.asked == 1
    refusals.begin_batch()
    assert refusals.still_parked(topics, parked[0], ("orders",)) is None
    assert refusals.promotable(topics, *later) is None
    assert topics.asked == 2

"""Which produce errors park a transaction as refused, and which only fail the batch."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from relay.relay import refuses_the_record


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

"""``outbox.state_log.read_state``: a relay's or checker's state records are read back to the
state partitions' high watermark. Relays and checkers write to the same partitions, each in its
own Kafka transactions; a read that stopped at the last stable offset - where a read_committed
read ends while another's transaction is open (a checker killed in a round, until its
transaction times out) - left out the records committed after it."""

from __future__ import annotations

import threading
import uuid

import pytest
from confluent_kafka import Producer

from outbox import OutboxSettings
from outbox.errors import KafkaOperationError
from outbox.protocol.state import CheckCount, StateKey, StateOwner, encode_state
from outbox.state_log import read_state
from outbox.watermarks import Watermarks
from tests.kafka_helpers import open_transaction, unique

pytestmark = pytest.mark.integration


def remember(bootstrap: str, topic: str, group: str, txn_id: str, checks: int) -> None:
    """One check count of ``group`` on partition 0, written outside any transaction."""
    key, value = encode_state(StateKey(StateOwner.CHECKER, group, txn_id), CheckCount(checks))
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, value, key, partition=0)
    assert producer.flush(30) == 0


@pytest.mark.parametrize("the_transaction", ["aborts", "commits"])
def test_records_after_a_transaction_still_open_are_read_once_it_ends(
    kafka_bootstrap: str, outbox_settings: OutboxSettings, the_transaction: str
) -> None:
    names, group = outbox_settings.topics, unique("checkers")
    config = {"bootstrap.servers": kafka_bootstrap}
    before, after = str(uuid.uuid4()), str(uuid.uuid4())
    # Given a remembered transaction, another service's Kafka transaction left open, and a
    # transaction remembered after it
    remember(kafka_bootstrap, names.state, group, before, 1)
    opened = open_transaction(kafka_bootstrap, names.state)
    ends = threading.Timer(
        2.0, opened.abort_transaction if the_transaction == "aborts" else opened.commit_transaction
    )
    watermarks = Watermarks(config)
    try:
        remember(kafka_bootstrap, names.state, group, after, 2)
        # When the state is read while that transaction is open, and it ends 2 s later
        ends.start()
        found = read_state(config, names, StateOwner.CHECKER, group, [0, 1], watermarks=watermarks)
    finally:
        ends.join()
        watermarks.close()
    # Then both are read back
    assert found == {before: (0, CheckCount(1)), after: (0, CheckCount(2))}


def test_a_read_held_by_a_transaction_that_never_ends_fails_and_says_why(
    kafka_bootstrap: str, outbox_settings: OutboxSettings
) -> None:
    names, group = outbox_settings.topics, unique("checkers")
    config = {"bootstrap.servers": kafka_bootstrap}
    opened = open_transaction(kafka_bootstrap, names.state)
    watermarks = Watermarks(config)
    try:
        remember(kafka_bootstrap, names.state, group, str(uuid.uuid4()), 1)
        with pytest.raises(KafkaOperationError, match="transaction another relay or checker"):
            read_state(
                config,
                names,
                StateOwner.CHECKER,
                group,
                [0],
                watermarks=watermarks,
                idle_limit_s=3,
            )
    finally:
        opened.abort_transaction(30)
        watermarks.close()

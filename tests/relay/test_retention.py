"""Retention removing half records before their COMMIT was read: a clear dead letter, no stall.

Retention shorter than a transaction's life is an operator's mistake, but a real one: the relay
must say which transaction it cost and go on, not wait for records that can never be read.
"""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from outbox.protocol import OpState
from outbox.protocol.dead_letter import DeadLetterHeader
from tests.kafka_helpers import unique, watermarks
from tests.relay.test_partitions import relay_on
from tests.relay.test_pending import committed_offset
from tests.relay.test_relay import (
    Stream,
    delivered,
    expected,
    read_topic,
    wait_for,
)

pytestmark = pytest.mark.integration


def end_of(bootstrap: str, topic: str, partition: int) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("end")})
    try:
        return watermarks(consumer, TopicPartition(topic, partition))[1]
    finally:
        consumer.close()


def remove_up_to_the_end(bootstrap: str, topic: str, partition: int) -> int:
    """What retention does, now: the partition's log start moves to its end."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    [future] = admin.delete_records([TopicPartition(topic, partition, -1)]).values()
    return int(future.result(30).low_watermark)


@pytest.mark.parametrize("later_traffic", [True, False], ids=["with-later-traffic", "alone"])
def test_a_commit_whose_halves_retention_removed_is_dead_lettered_and_the_relay_goes_on(
    kafka_bootstrap: str, later_traffic: bool
) -> None:
    stream = Stream(kafka_bootstrap, unique("__outbox-retention"))
    topics = stream.settings.topics
    # Given a transaction whose halves retention removed before any relay read them
    [gone] = stream.write_halves([(b"k", 2, OpState.COMMIT)])
    start = remove_up_to_the_end(kafka_bootstrap, topics.half, gone.partition)
    assert start > max(gone.offsets)
    # (and, maybe, a later transaction on the same partition)
    after = stream.write_halves([(b"k", 1, OpState.COMMIT)]) if later_traffic else []
    # When its COMMIT arrives
    stream.write_ops([gone, *after])
    stream.committed.pop(gone.txn_id)  # it cannot be delivered: its records are gone
    relay = relay_on(stream)
    try:
        # Then it is dead-lettered with the reason, within the relay's verification delay
        wait_for(lambda: read_topic(kafka_bootstrap, topics.dead_letter), timeout=30)
        [letter] = read_topic(kafka_bootstrap, topics.dead_letter)
        reason = dict(letter.headers())[DeadLetterHeader.REASON].decode()
        assert gone.txn_id in reason and "not found (retention?)" in reason
        # and the later transaction is delivered, once; nothing of the lost one is invented
        wait_for(lambda: set(delivered(kafka_bootstrap, stream)) >= expected(stream))
        seen = delivered(kafka_bootstrap, stream)
        assert set(seen) == expected(stream) and max(seen.values(), default=1) == 1
        # and its committed progress on the op partition moves past the lost COMMIT
        op_end = end_of(kafka_bootstrap, topics.op, gone.partition)
        wait_for(
            lambda: (
                committed_offset(
                    kafka_bootstrap, relay.relay.settings.group_id, topics.op, gone.partition
                )
                >= op_end
            ),
            timeout=30,
        )
    finally:
        relay.stop()

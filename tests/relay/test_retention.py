"""Retention removing half records before their COMMIT was read: a clear dead letter, no stall.

Retention shorter than a transaction's life is an operator's mistake, but a real one: the relay
must say which transaction it cost and go on, not wait for records that can never be read.
"""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import Consumer, TopicPartition

from outbox.protocol import OpState
from outbox.protocol.dead_letter import DeadLetterHeader
from tests.kafka_helpers import remove_up_to_the_end, unique, watermarks
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
        assert gone.txn_id in reason and "removed by retention" in reason
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


def test_the_relay_goes_on_from_the_op_log_start_when_retention_removed_ops_it_had_not_read(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    stream = Stream(kafka_bootstrap, unique("__outbox-op-retention"))
    topics = stream.settings.topics
    group = unique("relay")

    def committed_op(partition: int) -> int:
        return committed_offset(kafka_bootstrap, group, topics.op, partition)

    # Given a relay that delivered a transaction, committed its progress and stopped
    [first] = stream.write_halves([(b"k", 1, OpState.COMMIT)])
    stream.write_ops([first])
    relay = relay_on(stream, group_id=group)
    try:
        wait_for(lambda: set(delivered(kafka_bootstrap, stream)) >= expected(stream))
        op_end = end_of(kafka_bootstrap, topics.op, first.partition)
        wait_for(lambda: committed_op(first.partition) >= op_end, timeout=30)
    finally:
        relay.stop()
    # and, while it was stopped for longer than the op topic's retention, a COMMIT that
    # retention removed unread (the op topic is compact,delete: delete_records works on it)
    [lost] = stream.write_halves([(b"k", 2, OpState.COMMIT)])
    stream.write_ops([lost])
    stream.committed.pop(lost.txn_id)  # its decision is gone: the checker decides it again
    log_start = remove_up_to_the_end(kafka_bootstrap, topics.op, lost.partition)
    assert log_start > committed_op(lost.partition)
    # and a transaction decided after that
    [later] = stream.write_halves([(b"k", 1, OpState.COMMIT)])
    stream.write_ops([later])
    # When the relay starts again from its committed op offset, below the log start
    with caplog.at_level(logging.ERROR, logger="relay"):
        relay = relay_on(stream, group_id=group)
        try:
            # Then the later transaction is delivered, once, and nothing of the lost one
            wait_for(lambda: set(delivered(kafka_bootstrap, stream)) >= expected(stream), 60)
            seen = delivered(kafka_bootstrap, stream)
            assert set(seen) == expected(stream) and max(seen.values()) == 1
            assert later.txn_id in {txn for txn, _ in seen}
            # and its committed op progress moves past the removed ops
            op_end = end_of(kafka_bootstrap, topics.op, lost.partition)
            wait_for(lambda: committed_op(lost.partition) >= op_end, timeout=30)
        finally:
            relay.stop()
    # and it said which ops retention removed before it read them
    removed = f"{topics.op}[{lost.partition}]: ops at offsets"
    assert any(
        removed in r.getMessage() and "removed by retention" in r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR
    ), [r.getMessage() for r in caplog.records]

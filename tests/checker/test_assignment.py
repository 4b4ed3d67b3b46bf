"""Taking partitions: where the checker starts reading them and the check counts it gets back,
each call to the broker counted as the loop turning (the watchdog and ``/healthz`` measure the
loop; an assignment over many partitions, each call bounded, can take longer than their limit)."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from checker.assignment import progress_metadata, restore_counts, starts
from outbox import OutboxSettings
from outbox.protocol.state import CheckCount, StateKey, StateOwner, encode_state
from outbox.watermarks import Watermarks
from tests.kafka_helpers import unique

pytestmark = pytest.mark.integration


def test_each_broker_call_of_an_assignment_counts_as_the_loop_turning(
    kafka_bootstrap: str, outbox_settings: OutboxSettings
) -> None:
    names, group = outbox_settings.topics, unique("checkers")
    config = {"bootstrap.servers": kafka_bootstrap}
    counts = {p: {str(uuid.uuid4()): CheckCount(checks=p + 1) for _ in range(5)} for p in (0, 2)}
    writer = Producer(config)
    for p, remembered in counts.items():
        for txn_id, count in remembered.items():
            key, value = encode_state(StateKey(StateOwner.CHECKER, group, txn_id), count)
            writer.produce(names.state, value, key, partition=p)
    assert writer.flush(30) == 0
    consumer = Consumer({**config, "group.id": group, "enable.auto.commit": False})
    watermarks = Watermarks(config)
    try:
        progress = [
            TopicPartition(names.half, 1, 0),
            TopicPartition(names.op, 1, 0, metadata=progress_metadata(1_000)),
        ]
        consumer.commit(offsets=progress, asynchronous=False)

        turns: list[str] = []
        found = starts(
            consumer, names, [0, 1, 2], slack_ms=0, progress=lambda: turns.append("starts")
        )
        restored = restore_counts(
            config,
            names,
            group,
            [0, 1, 2],
            watermarks=watermarks,
            progress=lambda: turns.append("state"),
        )
    finally:
        consumer.close()
        watermarks.close()

    assert found[1].half_offset == 0 and found[1].op_offset == 0  # the floor's offset: the end
    assert {p for p, start in found.items() if start.half_offset < 0} == {0, 2}  # the beginning
    expected = {t: (p, c) for p, remembered in counts.items() for t, c in remembered.items()}
    assert restored == expected
    # starts: the committed offsets, the op offsets for the one floor, and (the op topic being
    # empty) that partition's end; the state: the end offsets of three partitions, then each of
    # the ten records (a partition is done at its last record: no end-of-partition event waited)
    assert turns.count("starts") == 3
    assert turns.count("state") == 3 + 10

"""Reading the committed progress on assignment (unit: the consumer's answer is given)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from relay import Relay, RelaySettings


@dataclass
class Answer:
    """What ``Consumer.committed`` hands back per partition (its TopicPartition is read-only)."""

    topic: str
    partition: int
    offset: int
    metadata: str | None = None
    error: KafkaError | None = None


class Committed:
    def __init__(self, answers: list[Answer]) -> None:
        self.answers = answers

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[Answer]:
        return self.answers


@pytest.fixture
def relay() -> Relay:
    return Relay(RelaySettings(bootstrap_servers="unused:9092", topic_prefix="__outbox"))


def test_committed_offsets_become_the_progress_to_rebuild_from(relay: Relay) -> None:
    half, op = relay.names.half, relay.names.op
    consumer = Committed(
        [Answer(half, 0, 210), Answer(op, 0, 113), Answer(half, 1, -1001), Answer(op, 1, -1001)]
    )
    progress = relay._progress(consumer, [0, 1])  # type: ignore[arg-type]
    assert (progress[0].half_offset, progress[0].op_offset) == (210, 113)
    # nothing committed yet (OFFSET_INVALID without an error) is the start of both topics
    assert (progress[1].half_offset, progress[1].op_offset) == (0, 0)


def test_a_partition_answered_with_an_error_fails_the_assignment_instead_of_starting_at_0(
    relay: Relay,
) -> None:
    """UNSTABLE_OFFSET_COMMIT (a Kafka transaction's offsets still pending) and the like come
    with OFFSET_INVALID; taken for "nothing committed", the relay would promote every committed
    transaction of the partition again."""
    half, op = relay.names.half, relay.names.op
    unstable = KafkaError(KafkaError.UNSTABLE_OFFSET_COMMIT)
    consumer = Committed([Answer(half, 0, 210), Answer(op, 0, -1001, error=unstable)])
    with pytest.raises(KafkaException) as raised:
        relay._progress(consumer, [0])  # type: ignore[arg-type]
    assert raised.value.args[0].code() == KafkaError.UNSTABLE_OFFSET_COMMIT
    assert relay._committed == {}  # nothing remembered from a failed read

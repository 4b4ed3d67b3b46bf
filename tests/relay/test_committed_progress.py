"""Reading the committed progress on assignment (unit: the consumer's answer is given)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from relay import RelaySettings
from relay.accounting import Accounting
from relay.flow_control import FlowControl
from relay.log_ends import LogEnds
from relay.partitions import Partitions
from relay.rebalance import Rebalance


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


def rebalance_on(partitions: Partitions) -> Rebalance:
    """A rebalance that holds ``partitions`` and rebuilds nothing (nothing here connects)."""
    settings = RelaySettings(bootstrap_servers="unused:9092", topic_prefix="__outbox")
    names = settings.topics
    return Rebalance(
        settings,
        partitions,
        rebuild=lambda consumer, progress: {},
        flow_control=FlowControl(names.op, settings.max_queued_ops),
        ends=LogEnds(names.half),
        accounting=Accounting(names, partitions),
    )


@pytest.fixture
def partitions() -> Partitions:
    return Partitions()


@pytest.fixture
def rebalance(partitions: Partitions) -> Rebalance:
    return rebalance_on(partitions)


def test_committed_offsets_become_the_progress_to_rebuild_from(rebalance: Rebalance) -> None:
    half, op = rebalance.names.half, rebalance.names.op
    consumer = Committed(
        [Answer(half, 0, 210), Answer(op, 0, 113), Answer(half, 1, -1001), Answer(op, 1, -1001)]
    )
    progress = rebalance.read_progress(consumer, [0, 1])  # type: ignore[arg-type]
    assert (progress[0].half_offset, progress[0].op_offset) == (210, 113)
    # nothing committed yet (OFFSET_INVALID without an error) is the start of both topics
    assert (progress[1].half_offset, progress[1].op_offset) == (0, 0)


def test_a_partition_answered_with_an_error_fails_the_assignment_instead_of_starting_at_0(
    rebalance: Rebalance, partitions: Partitions
) -> None:
    """UNSTABLE_OFFSET_COMMIT (a Kafka transaction's offsets still pending) and the like come
    with OFFSET_INVALID; taken for "nothing committed", the relay would promote every committed
    transaction of the partition again."""
    half, op = rebalance.names.half, rebalance.names.op
    unstable = KafkaError(KafkaError.UNSTABLE_OFFSET_COMMIT)
    consumer = Committed([Answer(half, 0, 210), Answer(op, 0, -1001, error=unstable)])
    with pytest.raises(KafkaException) as raised:
        rebalance.read_progress(consumer, [0])  # type: ignore[arg-type]
    assert raised.value.args[0].code() == KafkaError.UNSTABLE_OFFSET_COMMIT
    assert partitions.committed == {}  # nothing remembered from a failed read

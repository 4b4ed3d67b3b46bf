"""``max_queued_ops``: reading an op partition pauses while its queue is long, and resumes.

librdkafka drops what it fetched for a paused partition and fetches again from the application's
position on resume: a backlog read through many pauses must still deliver each message once, in
per-key order.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from confluent_kafka import Consumer, TopicPartition

from outbox.protocol import OpState
from outbox.protocol.topics import TopicNames
from relay.flow_control import FlowControl
from relay.state import PartitionState
from tests.kafka_helpers import unique
from tests.relay.harness import wait_for
from tests.relay.test_partitions import relay_on
from tests.relay.test_relay import Stream, delivered, expected, promotion_order


class Pauses:
    """A stand-in consumer: notes what is paused and resumed."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.calls += [("pause", tp.partition) for tp in partitions]

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.calls += [("resume", tp.partition) for tp in partitions]


def test_an_op_partition_pauses_past_the_limit_and_resumes_at_half_of_it() -> None:
    flow = FlowControl("ops", max_queued_ops=4)
    consumer = Pauses()
    state = PartitionState(0)
    for offset in range(5):
        state.add_op(offset, None)
    flow.update(consumer, {0: state})  # type: ignore[arg-type]
    assert consumer.calls == [("pause", 0)] and flow.paused == {0}
    state.queue.popleft()
    state.queue.popleft()
    flow.update(consumer, {0: state})  # type: ignore[arg-type]
    assert consumer.calls == [("pause", 0)]  # 3 left: above half of the limit
    state.queue.popleft()
    flow.update(consumer, {0: state})  # type: ignore[arg-type]
    assert consumer.calls == [("pause", 0), ("resume", 0)] and flow.paused == set()


@pytest.mark.integration
def test_a_long_op_queue_pauses_its_partition_and_a_backlog_still_goes_once_in_order(
    kafka_bootstrap: str,
) -> None:
    stream = Stream(kafka_bootstrap, unique("__outbox-flow"))
    # Given a backlog far longer than the queue a partition may hold
    stream.write([(f"key-{i % 7}".encode(), 1 + i % 2, OpState.COMMIT) for i in range(3000)])
    queued: list[int] = []
    paused: list[int] = []

    class Watched(FlowControl):
        """Notes, after every turn of the loop, the longest queue and the paused count."""

        def update(self, consumer: Consumer, states: Mapping[int, PartitionState]) -> None:
            super().update(consumer, states)
            queued.append(max((len(s.queue) for s in states.values()), default=0))
            paused.append(len(self.paused))

    watched = Watched(TopicNames(stream.settings.topic_prefix).op, max_queued_ops=20)
    relay = relay_on(stream, max_queued_ops=20, batch_max_records=500, flow_control=watched)
    try:
        wait_for(lambda: set(delivered(kafka_bootstrap, stream)) >= expected(stream), 120, "all")
        # Then reading paused on a long queue, and every partition was resumed
        assert max(paused) > 0 and max(queued) > 20
        wait_for(lambda: paused[-1] == 0, 10, "resumed")
    finally:
        relay.stop()
    seen = delivered(kafka_bootstrap, stream)
    assert set(seen) == expected(stream) and max(seen.values()) == 1
    order = promotion_order(kafka_bootstrap, stream.real_topic)
    assert dict(order) == dict(stream.commit_order)

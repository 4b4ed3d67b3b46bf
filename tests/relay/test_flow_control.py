"""``max_queued_ops``: reading an op partition pauses while its queue is long, and resumes.

librdkafka drops what it fetched for a paused partition and fetches again from the application's
position on resume: a backlog read through many pauses must still deliver each message once, in
per-key order.
"""

from __future__ import annotations

import pytest

from outbox.protocol import OpState
from tests.kafka_helpers import unique
from tests.relay.harness import wait_for
from tests.relay.test_partitions import relay_on
from tests.relay.test_relay import Stream, delivered, expected, promotion_order

pytestmark = pytest.mark.integration


def test_a_long_op_queue_pauses_its_partition_and_a_backlog_still_goes_once_in_order(
    kafka_bootstrap: str,
) -> None:
    stream = Stream(kafka_bootstrap, unique("__outbox-flow"))
    # Given a backlog far longer than the queue a partition may hold
    stream.write([(f"key-{i % 7}".encode(), 1 + i % 2, OpState.COMMIT) for i in range(3000)])
    relay = relay_on(stream, max_queued_ops=20, batch_max_records=500)
    queued: list[int] = []
    paused: list[int] = []
    flow_control = relay.relay._flow_control

    def watched() -> None:
        flow_control()
        queued.append(max((len(s.queue) for s in relay.relay.states.values()), default=0))
        paused.append(len(relay.relay._paused))

    relay.relay._flow_control = watched  # type: ignore[method-assign]
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

"""A late repeated op after a restart: the producer's COMMIT arriving after the checker's.

The restarted relay remembers no decision: the committed half offset is past the transaction's
records and it is not pending, so the repeat is told by position (counted, never acted on).
Many decisions before the restart: tests/relay/test_durable_decisions.py.
"""

from __future__ import annotations

import time

import pytest

from outbox.protocol import OpState
from tests.kafka_helpers import unique
from tests.relay.harness import wait_for
from tests.relay.test_partitions import relay_on
from tests.relay.test_relay import Stream, delivered, expected

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("repeat", [OpState.COMMIT, OpState.ROLLBACK])
def test_an_op_repeated_after_a_restart_inside_the_window_changes_nothing(
    kafka_bootstrap: str, repeat: OpState
) -> None:
    stream = Stream(kafka_bootstrap, unique("__outbox-late"))
    group = unique("relay")
    # Given a committed transaction promoted, and the relay stopped cleanly (progress committed)
    [decided] = stream.write_halves([(b"k", 2, OpState.COMMIT)])
    stream.write_ops([decided])
    first = relay_on(stream, group_id=group)
    try:
        wait_for(lambda: set(delivered(kafka_bootstrap, stream)) >= expected(stream), 60, "it")
    finally:
        first.stop()
    # When a restarted relay reads the same decision again (or a conflicting one), then more
    second = relay_on(stream, group_id=group)
    try:
        stream.write_ops([decided._replace(decision=repeat)])
        stream.committed.pop(decided.txn_id, None)
        stream.rolled_back.discard(decided.txn_id)
        stream.write([(b"k", 1, OpState.COMMIT)])
        stream.committed[decided.txn_id] = 2
        wait_for(lambda: set(delivered(kafka_bootstrap, stream)) >= expected(stream), 60, "after")
        time.sleep(2)
        # Then the repeat is counted as one, and nothing is delivered twice
        assert second.relay.totals()["repeats"] == 1
    finally:
        second.stop()
    seen = delivered(kafka_bootstrap, stream)
    assert set(seen) == expected(stream) and max(seen.values()) == 1

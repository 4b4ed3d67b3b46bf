"""Nothing the relay must remember grows into a bounded Kafka field, and nothing it decided is
undone by forgetting: many parked transactions, many decisions before a restart, a repeat
however late.

Each test runs relays on a real broker and ends in a read_committed read of the real topics.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from outbox.protocol import Header, OpState
from tests.kafka_helpers import create_topic, unique
from tests.relay.harness import wait_for
from tests.relay.test_partitions import relay_on
from tests.relay.test_relay import Stream, delivered, expected, read_topic

pytestmark = pytest.mark.integration

PARKED = 1000
ORDINARY = 200


def promoted(bootstrap: str, topic: str) -> Counter[tuple[str, int]]:
    seen: Counter[tuple[str, int]] = Counter()
    for msg in read_topic(bootstrap, topic):
        headers = dict(msg.headers())
        seen[(headers[Header.TXN_ID].decode(), int(headers[Header.MESSAGE_INDEX]))] += 1
    return seen


@pytest.mark.scale
@pytest.mark.parametrize(
    "held",
    [
        pytest.param(10_000, id="held"),
        # 900 of them over the memory cap: read back by offset to be parked, then left alone
        # until their topic appears (before, read back every batch)
        pytest.param(100, id="over-the-memory-cap"),
    ],
)
def test_a_thousand_parked_transactions_on_one_partition_hold_back_nothing_else(
    kafka_bootstrap: str, held: int
) -> None:
    """Before: the parked ids went into the offset-commit metadata, over the broker's
    offset.metadata.max.bytes (4096): every Kafka transaction aborted, nothing delivered."""
    stream = Stream(kafka_bootstrap, unique("__outbox-parked"))
    group = unique("relay")
    ghost = unique("missing")
    # Given 1,000 committed transactions on one half partition, for a topic that does not
    # exist (auto-creation off, the default), then ordinary ones on the same and other keys
    real = stream.real_topic
    stream.real_topic = ghost
    stream.write([(b"same-key", 1, OpState.COMMIT) for _ in range(PARKED)])
    parked = dict(stream.committed)
    stream.committed.clear()
    stream.real_topic = real
    keys = [b"same-key", b"other-1", b"other-2", b"other-3"]
    stream.write([(keys[i % len(keys)], 1, OpState.COMMIT) for i in range(ORDINARY)])
    relay = relay_on(stream, group_id=group, topic_refresh_s=1, max_held_records=held)
    try:
        # Then every ordinary one is delivered, and the 1,000 wait parked
        wait_for(lambda: set(delivered(kafka_bootstrap, stream)) >= expected(stream), 120, "all")
        wait_for(lambda: relay.relay.stats()["parked"] == PARKED, 60, "1,000 parked")
        assert relay.relay.aborts == 0
    finally:
        relay.stop()
    # And a restarted relay still knows them (the state topic), and still holds nothing back
    relay = relay_on(stream, group_id=group, topic_refresh_s=1, max_held_records=held)
    try:
        wait_for(lambda: relay.relay.stats()["parked"] == PARKED, 120, "1,000 parked again")
        stream.write([(keys[i % len(keys)], 1, OpState.COMMIT) for i in range(20)])
        wait_for(lambda: set(delivered(kafka_bootstrap, stream)) >= expected(stream), 60, "more")
        # When their topic appears, each is delivered, once
        create_topic(kafka_bootstrap, ghost, partitions=3)
        want = {(t, 0) for t in parked}
        wait_for(lambda: set(promoted(kafka_bootstrap, ghost)) >= want, 120, "the parked ones")
        wait_for(lambda: relay.relay.stats()["parked"] == 0, 30, "none parked")
        time.sleep(2)
    finally:
        relay.stop()
    seen = promoted(kafka_bootstrap, ghost)
    assert set(seen) == want and max(seen.values()) == 1
    ordinary = delivered(kafka_bootstrap, stream)
    assert set(ordinary) == expected(stream) and max(ordinary.values()) == 1


@pytest.mark.parametrize(
    "others",
    [
        pytest.param(0, id="right-after"),
        # 500 decisions between: a bound pushed, ~14 s each (make test-scale)
        pytest.param(500, id="after-500-decisions", marks=pytest.mark.scale),
    ],
)
@pytest.mark.parametrize("repeat", [OpState.COMMIT, OpState.ROLLBACK])
def test_a_decision_repeated_after_others_and_a_restart_changes_nothing(
    kafka_bootstrap: str, repeat: OpState, others: int
) -> None:
    """Before: a decided transaction was remembered in an LRU and, after a restart, only over
    a trailing time window; a repeat past either was promoted again. The restarted relay
    remembers no decision: the repeat is told by position (counted, never acted on)."""
    stream = Stream(kafka_bootstrap, unique("__outbox-repeat"))
    group = unique("relay")
    # Given a committed transaction promoted, then many more decided after it
    [decided] = stream.write_halves([(b"k", 2, OpState.COMMIT)])
    stream.write_ops([decided])
    first = relay_on(stream, group_id=group)
    try:
        wait_for(lambda: set(delivered(kafka_bootstrap, stream)) >= expected(stream), 60, "it")
        stream.write([(f"k{i % 7}".encode(), 1, OpState.COMMIT) for i in range(others)])
        wait_for(lambda: set(delivered(kafka_bootstrap, stream)) >= expected(stream), 60, "more")
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
        # Then nothing is delivered twice, and the repeat is counted
        seen = delivered(kafka_bootstrap, stream)
        assert set(seen) == expected(stream) and max(seen.values()) == 1
        wait_for(lambda: second.relay.totals().get("repeats") == 1, 30, "the repeat counted")
    finally:
        second.stop()


def test_a_rebuild_over_many_decisions_leaves_no_decided_transaction_pending(
    kafka_bootstrap: str,
) -> None:
    """Before: the rebuild re-learnt at most ``decided_memory`` decisions; the half records of
    the others looked pending after a restart and were put back forever."""
    stream = Stream(kafka_bootstrap, unique("__outbox-rebuild"))
    group = unique("relay")
    # Given one transaction still undecided (it holds the rebuild point back), then 1,000
    # decided after it on the same partition
    [open_one] = stream.write_halves([(b"k", 1, OpState.COMMIT)])
    stream.write([(b"k", 1, OpState.COMMIT) for _ in range(1000)])
    first = relay_on(stream, group_id=group)
    try:
        wait_for(lambda: set(delivered(kafka_bootstrap, stream)) >= expected(stream), 60, "all")
    finally:
        first.stop()
    # When a restarted relay rebuilds, and the open one commits
    second = relay_on(stream, group_id=group)
    try:
        stream.write_ops([open_one])
        wait_for(lambda: set(delivered(kafka_bootstrap, stream)) >= expected(stream), 60, "it")
        # Then nothing is left pending: every re-read half was recognised as decided
        wait_for(lambda: second.relay.stats()["pending"] == 0, 30, "nothing pending")
        time.sleep(2)
    finally:
        second.stop()
    seen = delivered(kafka_bootstrap, stream)
    assert set(seen) == expected(stream) and max(seen.values()) == 1

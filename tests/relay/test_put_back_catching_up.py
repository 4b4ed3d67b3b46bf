"""Put-back measured against the ops read, on a real broker: a relay catching up on a backlog
puts back no transaction whose op it has not read yet, and a restarted relay on a quiet op
partition still puts back what stays undecided.

A transaction is put back when it has been undecided for ``put_back_after_s`` *as of the ops
the relay has read* (``relay.op_frontier``): the broker's clock, as the newest record read
tells it, runs ahead of the op partition while the relay reads its half partition ahead of it.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from outbox.protocol import (
    DecidedBy,
    OpRecord,
    OpState,
    decode_half,
    decode_op,
    encode_op,
)
from tests.kafka_helpers import read_to_end, unique
from tests.relay.test_partitions import relay_on
from tests.relay.test_relay import Stream, delivered, wait_for

pytestmark = pytest.mark.integration


def copies_on(bootstrap: str, stream: Stream) -> list[str]:
    """The transaction ids of the put-back copies on the half topic (read_committed)."""
    found = []
    for msg in read_to_end(bootstrap, stream.settings.topics.half):
        record = decode_half(value=msg.value(), headers=msg.headers(), offset=msg.offset())
        if record.is_copy:
            found.append(record.txn_id)
    return found


def op_delays_ms(bootstrap: str, stream: Stream) -> dict[str, int]:
    """Each transaction's op stamp minus its first half record's (broker time)."""
    halves: dict[str, int] = {}
    for msg in read_to_end(bootstrap, stream.settings.topics.half):
        record = decode_half(value=msg.value(), headers=msg.headers(), offset=msg.offset())
        if not record.is_copy:
            halves.setdefault(record.txn_id, msg.timestamp()[1])
    delays = {}
    for msg in read_to_end(bootstrap, stream.settings.topics.op):
        op = decode_op(msg.key(), msg.value())
        if op is not None and op.txn_id in halves:
            delays[op.txn_id] = msg.timestamp()[1] - halves[op.txn_id]
    return delays


def test_a_relay_catching_up_puts_back_no_transaction_whose_op_it_has_not_read(
    kafka_bootstrap: str,
) -> None:
    """300 transactions on one partition over ~6 s, each op written right after its halves;
    a relay started afterwards (as after downtime) with ``put_back_after_s=2`` reads the half
    partition ahead of the op partition. Before: the clock jumped to the newest half read and
    all 300 were put back, already decided by ops not read yet."""
    stream = Stream(kafka_bootstrap, unique("__outbox-catchup"))
    for _ in range(30):
        stream.write([(b"k", 1, OpState.COMMIT)] * 10)
        time.sleep(0.2)
    assert len(stream.committed) == 300
    relay = relay_on(stream, put_back_after_s=2, batch_max_records=20)
    try:
        wait_for(lambda: len(delivered(kafka_bootstrap, stream)) >= 300)
        time.sleep(3)  # anything put back late would be on the topic by now
    finally:
        relay.stop()
    counts = delivered(kafka_bootstrap, stream)
    assert set(counts) == {(txn, 0) for txn in stream.committed}
    assert set(counts.values()) == {1}
    # A relay keeping up puts back a transaction whose op came 2 s after its halves (a loaded
    # machine can make one): those may be copied, no other
    delays = op_delays_ms(kafka_bootstrap, stream)
    prompt = {txn for txn, delay in delays.items() if delay < 1_500}
    assert len(prompt) >= 250, sorted(delays.values())[-20:]
    assert prompt.isdisjoint(copies_on(kafka_bootstrap, stream))


def test_a_restarted_relay_on_a_quiet_op_partition_ending_in_a_commit_marker_still_puts_back(
    kafka_bootstrap: str,
) -> None:
    """The op partition ends with a Kafka transaction's commit marker (ops written as the
    checker writes them) and the restarted relay consumes nothing there: it must still learn
    the partition is read to its end, or an undecided transaction is never put back."""
    stream = Stream(kafka_bootstrap, unique("__outbox-quiet"))
    [decided] = stream.write_halves([(b"k", 1, OpState.COMMIT)])
    writer = Producer(
        {"bootstrap.servers": kafka_bootstrap, "transactional.id": unique("checker-like")}
    )
    writer.init_transactions(30)
    writer.begin_transaction()
    op = OpRecord(
        decided.txn_id,
        OpState.COMMIT,
        "g",
        decided.partition,
        decided.offsets,
        DecidedBy.CHECKER,
        0,
    )
    key, value = encode_op(op)
    writer.produce(stream.settings.topics.op, key=key, value=value, partition=decided.partition)
    writer.commit_transaction(30)
    stream.committed[decided.txn_id] = 1
    group = unique("relay")
    first = relay_on(stream, group_id=group, put_back_after_s=1)
    try:
        wait_for(lambda: len(delivered(kafka_bootstrap, stream)) == 1)
        wait_for(lambda: first.relay.totals()["promoted"] == 1)
    finally:
        first.stop()
    [undecided] = stream.write_halves([(b"k", 1, OpState.COMMIT)])  # its op never comes
    second = relay_on(stream, group_id=group, put_back_after_s=1)
    try:
        wait_for(lambda: undecided.txn_id in copies_on(kafka_bootstrap, stream), timeout=30)
    finally:
        second.stop()
    assert copies_on(kafka_bootstrap, stream).count(decided.txn_id) == 0
    assert delivered(kafka_bootstrap, stream) == {(decided.txn_id, 0): 1}


def test_a_restarted_relay_passes_the_commit_marker_its_put_back_left_at_the_end(
    kafka_bootstrap: str,
) -> None:
    """The half partition ends in the commit marker of the relay's own put-back. After a
    restart the reader must pass the end the partition had (copies an earlier life put back may
    lie before it) before it can tell a repeated op from a late one; a marker is never
    delivered, so before, a repeated op - and every op behind it - waited for the next half
    record or a put-back (300 s by default, an hour here)."""
    stream = Stream(kafka_bootstrap, unique("__outbox-marker"))
    [decided, undecided] = stream.write_halves([(b"k", 1, OpState.COMMIT)] * 2)
    stream.write_ops([decided])
    group = unique("relay")
    first = relay_on(stream, group_id=group, put_back_after_s=1)
    try:
        wait_for(lambda: (decided.txn_id, 0) in delivered(kafka_bootstrap, stream))
        wait_for(lambda: undecided.txn_id in copies_on(kafka_bootstrap, stream))
    finally:
        first.stop()
    stream.write_ops([decided, undecided])  # a repeat, then the other one's decision
    second = relay_on(stream, group_id=group, put_back_after_s=3600)
    try:
        wait_for(lambda: (undecided.txn_id, 0) in delivered(kafka_bootstrap, stream), timeout=30)
        wait_for(lambda: second.relay.totals()["repeats"] == 1, timeout=10)
    finally:
        second.stop()
    assert delivered(kafka_bootstrap, stream) == {(decided.txn_id, 0): 1, (undecided.txn_id, 0): 1}

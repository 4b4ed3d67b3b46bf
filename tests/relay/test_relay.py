"""The relay on a real broker: promotion, rollback, dead letters, and restarts mid-stream."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import replace
from typing import NamedTuple

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from outbox import OutboxSettings, ensure_topics
from outbox.protocol import (
    DecidedBy,
    HalfMessage,
    Header,
    OpRecord,
    OpState,
    encode_half_headers,
    encode_op,
    new_transaction_id,
    partition_for,
)
from outbox.protocol.dead_letter import DeadLetterHeader
from relay import Relay, RelaySettings
from relay.flow_control import FlowControl
from relay.rebalance import Rebalance
from tests.kafka_helpers import create_topic, read_to_end, set_topic_config, unique

pytestmark = pytest.mark.integration
PARTITIONS = 3


class Written(NamedTuple):
    """A transaction whose halves are on the half topic."""

    txn_id: str
    partition: int
    key: bytes
    count: int
    decision: OpState
    offsets: tuple[int, ...]


class Stream:
    """Writes transactions straight onto the internal topics, as producers would."""

    def __init__(self, bootstrap: str, prefix: str) -> None:
        self.settings = OutboxSettings(
            bootstrap_servers=bootstrap, producer_group="g", topic_prefix=prefix, partitions=3
        )
        ensure_topics(self.settings)
        # idempotent, as producers are: without it librdkafka's retries may reorder a partition's
        # records (a CI run saw one op land before 19 written ahead of it, on fresh topics)
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True}
        )
        self.committed: dict[str, int] = {}  # txn id -> message count
        self.rolled_back: set[str] = set()
        self.commit_order: dict[bytes, list[str]] = defaultdict(list)
        self.real_topic = unique("relayed")  # tests share the broker, not their real topic
        self.padding = 0  # bytes added to each value written from now on
        self.schema_version = 2  # of the half records written from now on
        create_topic(bootstrap, self.real_topic, partitions=3)

    def write(self, batch: list[tuple[bytes, int, OpState]]) -> None:
        """Each item: (key, message count, decision). Halves first, then ops, like producers."""
        self.write_ops(self.write_halves(batch))

    def write_halves(self, batch: list[tuple[bytes, int, OpState]]) -> list[Written]:
        """The halves of ``batch`` only; their ops are for :meth:`write_ops`."""
        offsets: dict[str, list[int]] = defaultdict(list)
        txns = []
        for key, count, decision in batch:
            txn_id, partition = new_transaction_id(), partition_for(key, PARTITIONS)
            txns.append((txn_id, partition, key, count, decision))
            for index in range(count):
                value = f"{txn_id}/{index}".encode() + b"." * self.padding
                message = HalfMessage(self.real_topic, value, key)
                headers = encode_half_headers(
                    txn_id=txn_id,
                    producer_group="g",
                    message=message,
                    index=index,
                    count=count,
                    created_at_ms=0,
                    schema_version=self.schema_version,
                )
                self.producer.produce(
                    self.settings.topics.half,
                    key=txn_id.encode(),
                    value=message.value,
                    headers=headers,
                    partition=partition,
                    on_delivery=lambda err, msg, t=txn_id: offsets[t].append(msg.offset()),
                )
        assert self.producer.flush(30) == 0
        return [
            Written(txn_id, partition, key, count, decision, tuple(sorted(offsets[txn_id])))
            for txn_id, partition, key, count, decision in txns
        ]

    def write_ops(self, written: list[Written]) -> None:
        """The ops, in order: the commit order the relay must keep is the ops' order on their
        partition, so each op landing after those written before it is checked, not assumed."""
        landed: dict[int, int] = {}  # the op's place in ``written`` -> its offset
        for place, (txn_id, partition, key, count, decision, offsets) in enumerate(written):
            op = OpRecord(txn_id, decision, "g", partition, offsets, DecidedBy.PRODUCER, 0)
            k, v = encode_op(op)
            self.producer.produce(
                self.settings.topics.op,
                key=k,
                value=v,
                partition=partition,
                on_delivery=lambda err, msg, p=place: landed.__setitem__(p, msg.offset()),
            )
            if decision is OpState.COMMIT:
                self.committed[txn_id] = count
                self.commit_order[key].append(txn_id)
            else:
                self.rolled_back.add(txn_id)
        assert self.producer.flush(30) == 0
        for partition in {w.partition for w in written}:
            offsets = [landed[p] for p, w in enumerate(written) if w.partition == partition]
            assert offsets == sorted(offsets), "the stream's own ops landed out of order"


def read_topic(bootstrap: str, topic: str) -> list:
    """Every record of ``topic`` a read_committed consumer sees now (:func:`read_to_end`)."""
    return read_to_end(bootstrap, topic)


def delivered(bootstrap: str, stream: Stream) -> Counter[tuple[str, int]]:
    seen: Counter[tuple[str, int]] = Counter()
    for msg in read_topic(bootstrap, stream.real_topic):
        headers = dict(msg.headers())
        seen[(headers[Header.TXN_ID].decode(), int(headers[Header.MESSAGE_INDEX]))] += 1
    return seen


def promotion_order(bootstrap: str, topic: str) -> dict[bytes, list[str]]:
    """Each key's transactions in the order their messages are on ``topic`` (a transaction's
    messages in a row count once)."""
    order: dict[bytes, list[str]] = defaultdict(list)
    for msg in read_topic(bootstrap, topic):
        txn = dict(msg.headers())[Header.TXN_ID].decode()
        if not order[msg.key()] or order[msg.key()][-1] != txn:
            order[msg.key()].append(txn)
    return order


def expected(stream: Stream) -> set[tuple[str, int]]:
    return {(t, i) for t, n in stream.committed.items() for i in range(n)}


class RelayThread:
    def __init__(self, settings: RelaySettings, *, flow_control: FlowControl | None = None) -> None:
        self.relay = Relay(settings, flow_control=flow_control)
        self.thread = threading.Thread(target=self.relay.run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.relay.close()
        self.thread.join(30)
        assert not self.thread.is_alive()


@pytest.fixture
def stream(kafka_bootstrap: str) -> Stream:
    return Stream(kafka_bootstrap, unique("__outbox-relay"))


@pytest.fixture
def relay_settings(kafka_bootstrap: str, stream: Stream) -> RelaySettings:
    return RelaySettings(
        bootstrap_servers=kafka_bootstrap,
        topic_prefix=stream.settings.topic_prefix,
        group_id=unique("relay"),
    )


@pytest.fixture
def relay(relay_settings: RelaySettings) -> Iterator[RelayThread]:
    running = RelayThread(relay_settings)
    yield running
    running.stop()


def wait_for(predicate, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.5)


def test_relay_promotes_committed_and_drops_rolled_back_transactions(
    kafka_bootstrap: str, stream: Stream, relay: RelayThread
) -> None:
    stream.write(
        [(b"a", 2, OpState.COMMIT), (b"b", 1, OpState.ROLLBACK), (b"c", 3, OpState.COMMIT)]
    )
    wait_for(lambda: set(delivered(kafka_bootstrap, stream)) >= expected(stream))
    time.sleep(1)
    records = read_topic(kafka_bootstrap, stream.real_topic)
    seen = delivered(kafka_bootstrap, stream)
    assert set(seen) == expected(stream)
    assert not {t for t, _ in seen} & stream.rolled_back
    first = next(m for m in records if m.key() == b"c")
    headers = dict(first.headers())
    assert headers[Header.PRODUCER_GROUP] == b"g"
    assert first.value() == f"{headers[Header.TXN_ID].decode()}/0".encode()


def test_half_records_of_both_schema_versions_are_promoted_once_each_in_commit_order(
    kafka_bootstrap: str, stream: Stream, relay: RelayThread
) -> None:
    # A rolling upgrade: producers still on version 1 beside upgraded ones, on the same keys.
    for version in (1, 2, 1, 2):
        stream.schema_version = version
        stream.write(
            [(b"a", 2, OpState.COMMIT), (b"b", 1, OpState.ROLLBACK), (b"c", 3, OpState.COMMIT)]
        )
    wait_for(lambda: set(delivered(kafka_bootstrap, stream)) >= expected(stream))
    time.sleep(1)
    seen = delivered(kafka_bootstrap, stream)
    assert set(seen) == expected(stream) and set(seen.values()) == {1}
    assert promotion_order(kafka_bootstrap, stream.real_topic) == {
        key: txns for key, txns in stream.commit_order.items()
    }
    assert relay.relay.totals()["bad_records"] == 0


@pytest.mark.parametrize("caught_up_commits", [True, False])
def test_a_relay_that_keeps_up_commits_after_each_poll_not_after_the_interval(
    kafka_bootstrap: str, stream: Stream, relay_settings: RelaySettings, caught_up_commits: bool
) -> None:
    settings = replace(
        relay_settings, commit_interval_s=25.0, commit_when_caught_up=caught_up_commits
    )
    running = RelayThread(settings)
    try:
        wait_for(lambda: running.relay.assigned[0] == frozenset(range(PARTITIONS)))
        began = time.monotonic()
        stream.write([(b"a", 1, OpState.COMMIT)])
        wait_for(lambda: set(delivered(kafka_bootstrap, stream)) >= expected(stream), 60)
        took = time.monotonic() - began
        # with it, one poll and a commit; without it, the 25 s interval (minus what had passed)
        assert (took < 10) is caught_up_commits, took
    finally:
        running.stop()


def test_bad_records_go_to_the_dead_letter_topic_with_their_reason_and_the_relay_goes_on(
    kafka_bootstrap: str, stream: Stream, relay: RelayThread
) -> None:
    topics = stream.settings.topics
    # a half record of an unknown schema version, an op of an unknown one, an op that is no JSON
    stream.producer.produce(
        topics.half, value=b"junk", headers=[("outbox-schema-version", b"99")], partition=0
    )
    stream.producer.produce(topics.op, key=b"k", value=json.dumps({"v": 7}).encode(), partition=0)
    stream.producer.produce(topics.op, key=b"k", value=b"{not json", partition=0)
    # an op on partition 0 naming half partition 1, and a COMMIT naming offsets past the end
    txn = new_transaction_id()
    for half_partition, offsets in ((1, (0,)), (0, (10_000,))):
        op = OpRecord(txn, OpState.COMMIT, "g", half_partition, offsets, DecidedBy.PRODUCER, 0)
        key, value = encode_op(op)
        stream.producer.produce(topics.op, key=key, value=value, partition=0)
        txn = new_transaction_id()
    stream.producer.flush(30)
    stream.write([(b"after", 1, OpState.COMMIT)])

    wait_for(lambda: set(delivered(kafka_bootstrap, stream)) >= expected(stream))
    wait_for(lambda: len(read_topic(kafka_bootstrap, topics.dead_letter)) >= 5)
    letters = read_topic(kafka_bootstrap, topics.dead_letter)
    reasons = sorted(dict(m.headers())[DeadLetterHeader.REASON].decode() for m in letters)
    assert len(reasons) == 5
    assert any("schema version b'99'" in r for r in reasons)
    assert any("schema version 7" in r for r in reasons)
    assert any("not a JSON document" in r for r in reasons)
    assert any("names half partition 1" in r for r in reasons)
    assert any("past the end" in r for r in reasons)
    # each keeps where it came from
    assert all(dict(m.headers())[DeadLetterHeader.SOURCE_TOPIC] for m in letters)


def test_a_dead_letter_its_topic_refuses_goes_without_the_original_and_the_relay_goes_on(
    kafka_bootstrap: str, stream: Stream, relay: RelayThread
) -> None:
    """Before, the refused dead letter failed its batch forever, and every partition of the
    instance waited with it."""
    topics = stream.settings.topics
    set_topic_config(kafka_bootstrap, topics.dead_letter, "max.message.bytes", "2048")
    # Given a bad record too large for the dead-letter topic, and good ones after it
    stream.producer.produce(
        topics.half, value=b"x" * 8000, headers=[("outbox-schema-version", b"99")], partition=0
    )
    stream.producer.flush(30)
    stream.write([(b"after", 1, OpState.COMMIT), (b"other", 2, OpState.COMMIT)])
    # Then the good ones are delivered once
    wait_for(lambda: set(delivered(kafka_bootstrap, stream)) >= expected(stream))
    wait_for(lambda: len(read_topic(kafka_bootstrap, topics.dead_letter)) >= 1)
    time.sleep(1)
    assert set(delivered(kafka_bootstrap, stream).values()) == {1}
    # and the dead letter says why and where the original is, without it
    [letter] = read_topic(kafka_bootstrap, topics.dead_letter)
    headers = dict(letter.headers())
    assert letter.value() is None and letter.key() is None
    assert b"schema version b'99'" in headers[DeadLetterHeader.REASON]
    assert b"Message size too large" in headers[DeadLetterHeader.OMITTED]
    assert headers[DeadLetterHeader.SOURCE_TOPIC] == topics.half.encode()
    assert headers[DeadLetterHeader.SOURCE_OFFSET] == b"0"
    assert relay.relay.stats()["aborts"] >= 1
    # and the counters count what was written, not the aborted attempt too
    assert relay.relay.dead_lettered == 1
    assert relay.relay.totals()["promoted"] == 2


def test_an_idle_partition_does_not_pin_its_committed_offset_behind_an_undecided_half(
    kafka_bootstrap: str, stream: Stream
) -> None:
    from tests.relay.test_pending import Halves, committed_offset

    halves = Halves(kafka_bootstrap, stream.settings.topic_prefix + "-idle")
    group = unique("relay")
    relay = halves.relay(group, put_back_after_s=1)
    try:
        # Given one undecided half and no other traffic at all
        [txn] = halves.write(1)
        partition, offset = halves.where[txn]
        # Then the relay's committed offset of that partition still moves past it
        wait_for(
            lambda: (
                committed_offset(kafka_bootstrap, group, halves.settings.topics.half, partition)
                > offset
            ),
            timeout=30,
        )
    finally:
        relay.stop()


@pytest.mark.scale
@pytest.mark.parametrize("transactions", [10_000])
def test_relay_restarted_mid_stream_loses_no_committed_message(
    kafka_bootstrap: str, stream: Stream, relay_settings: RelaySettings, transactions: int
) -> None:
    keys = [f"key-{i % 50}".encode() for i in range(transactions)]
    plan = [
        (k, 1 + i % 3, OpState.ROLLBACK if i % 10 == 0 else OpState.COMMIT)
        for i, k in enumerate(keys)
    ]
    first = RelayThread(relay_settings)
    # Given a relay working through a stream
    for chunk in range(0, transactions // 2, 1000):
        stream.write(plan[chunk : chunk + 1000])
    wait_for(lambda: len(delivered(kafka_bootstrap, stream)) > len(expected(stream)) // 3)
    # When it stops in the middle and a new instance takes over while the stream goes on
    first.stop()
    second = RelayThread(relay_settings)
    for chunk in range(transactions // 2, transactions, 1000):
        stream.write(plan[chunk : chunk + 1000])
    try:
        wait_for(lambda: set(delivered(kafka_bootstrap, stream)) >= expected(stream), timeout=120)
    finally:
        second.stop()
    # Then every committed message is there, nothing rolled back is, and per-key order holds
    seen = delivered(kafka_bootstrap, stream)
    assert set(seen) == expected(stream)
    # A clean stop commits what was delivered, so the second instance repeats nothing
    assert max(seen.values()) == 1
    assert len(stream.committed) == transactions - transactions // 10
    order = promotion_order(kafka_bootstrap, stream.real_topic)
    for key, txns in stream.commit_order.items():
        firsts = list(dict.fromkeys(order[key]))
        assert firsts == txns, f"order of {key!r} differs"


def test_a_failure_while_taking_assigned_partitions_restarts_the_session(
    kafka_bootstrap: str,
    stream: Stream,
    relay_settings: RelaySettings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A broker restart can fail the committed-offsets fetch inside the assignment callback
    (NOT_COORDINATOR); raised from there, it once killed the relay process."""
    real_progress = Rebalance.read_progress
    failures = []

    def fail_once(self: Rebalance, consumer: Consumer, numbers: list[int]) -> object:
        if not failures:
            failures.append(1)
            # raised by librdkafka's own call, as it was then (a Python-made exception
            # travels through the callback intact)
            consumer.committed([TopicPartition(self.names.half, n) for n in numbers], 1e-6)
        return real_progress(self, consumer, numbers)

    monkeypatch.setattr(Rebalance, "read_progress", fail_once)
    # Given a relay whose first assignment fails
    running = RelayThread(replace(relay_settings, retry_backoff_s=0.2))
    try:
        stream.write([(b"a", 2, OpState.COMMIT), (b"b", 1, OpState.COMMIT)])
        # Then it starts a new session, takes the partitions and promotes
        wait_for(lambda: set(delivered(kafka_bootstrap, stream)) >= expected(stream))
        assert failures == [1]
        assert running.relay.sessions >= 2
        assert running.thread.is_alive()
    finally:
        running.stop()
    assert max(delivered(kafka_bootstrap, stream).values()) == 1

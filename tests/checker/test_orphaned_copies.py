"""A checker group whose read position fell below the half topic's log start (down longer than
the retention, or new) still decides every undecided transaction: one whose original half
records retention removed, leaving only the relay's put-back copies, is taken up from a copy.

Before, such a transaction stayed undecided for ever: the checker ignored copies of transactions
it did not track, the relay put it back every ``put_back_after_s`` with no limit, and neither
oldest-pending gauge rose (the relay's restarts from each copy, the checker tracked nothing).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from confluent_kafka import Consumer, Producer, TopicPartition
from sqlalchemy.orm import sessionmaker

from checker import Checker
from outbox import LocalTransactionState, OutboxProducer, OutboxSettings
from outbox.checks.listener import FunctionResolver
from outbox.message import MessageView
from outbox.protocol import DecidedBy, HalfRecord, OpRecord, OpState, encode_op
from relay import Relay, RelaySettings
from tests.checker.test_checker import SECRET, Background, checker_settings, wait_for
from tests.kafka_helpers import admin_client, unique
from tests.outbox_cli.records import Writer
from tests.producer_fixtures import Topics, order_ids, orders
from tests.relay.test_relay import read_topic

pytestmark = pytest.mark.integration
KEY = b"customer-7"


@contextlib.contextmanager
def running(service: Checker | Relay) -> Iterator[None]:
    background = Background(service)
    try:
        yield
    finally:
        background.stop()


def committed_half(bootstrap: str, group: str, topic: str, partition: int) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        [tp] = consumer.committed([TopicPartition(topic, partition)], 30)
        return int(tp.offset)
    finally:
        consumer.close()


def delete_below(bootstrap: str, topic: str, partition: int, offset: int) -> int:
    """What retention does: the partition's log start moves to ``offset``."""
    admin = admin_client(bootstrap)
    [future] = admin.delete_records([TopicPartition(topic, partition, offset)]).values()
    return int(future.result(30).low_watermark)


def orders_group(settings: OutboxSettings) -> OutboxProducer:
    """An instance of producer group "orders" (the group :class:`Writer` writes for), to serve
    checks with a resolver of the test's own."""
    return OutboxProducer(dataclasses.replace(settings, producer_group="orders"))


@pytest.mark.parametrize("history", ["new-group", "down-past-retention", "restarted-while-pending"])
def test_a_transaction_whose_originals_retention_removed_is_decided_from_its_copies(
    kafka_bootstrap: str,
    outbox_settings: OutboxSettings,
    producer: OutboxProducer,
    session_factory: sessionmaker,
    engine: sa.Engine,
    topics: Topics,
    monkeypatch: pytest.MonkeyPatch,
    history: str,
) -> None:
    topic, prefix = unique("orders"), outbox_settings.topic_prefix
    names = outbox_settings.topics
    if history != "restarted-while-pending":
        producer.serve_checks(engine=engine, secret=SECRET)
    group = unique("checker")

    def place(kind: str) -> str:
        """An order row and its message; a "rollback" raises after the send. Its txn id."""
        order_id = f"{kind}-{uuid.uuid4().hex[:8]}"
        with contextlib.suppress(RuntimeError), producer.transaction(session_factory) as txn:
            assert txn.session is not None
            txn.session.execute(orders.insert().values(id=order_id, amount=1))
            txn.send(topic, order_id, key=KEY)
            if kind == "rollback":
                raise RuntimeError(kind)
        placed[txn.txn_id] = order_id
        return txn.txn_id

    def halves_of(txn_id: str) -> list[HalfRecord]:
        return [h for h in topics.halves() if h.txn_id == txn_id]

    def delivered() -> list[str]:
        return sorted(m.value().decode() for m in read_topic(kafka_bootstrap, topic))

    placed: dict[str, str] = {}
    relay = Relay(
        RelaySettings(
            bootstrap_servers=kafka_bootstrap,
            topic_prefix=prefix,
            group_id=unique("relay"),
            auto_create_topics=True,
            put_back_after_s=1,
        )
    )
    with running(relay):
        before = None
        if history == "down-past-retention":
            # Given a checker group that ran, read the half partition and committed its progress
            before = place("before")
            [first] = halves_of(before)
            with running(Checker(checker_settings(kafka_bootstrap, prefix, group_id=group))):
                wait_for(
                    lambda: (
                        committed_half(kafka_bootstrap, group, names.half, first.partition)
                        > first.offset
                    )
                )
        # and, while no checker runs, transactions whose ops were lost (the producer crashed
        # after its commit or its rollback), put back by the relay after 1 s
        monkeypatch.setattr(producer.kafka, "send_op", lambda op: False)
        committed, rolled_back, decided = place("commit"), place("rollback"), place("decided")
        monkeypatch.undo()
        lost = [committed, rolled_back, decided]
        wait_for(lambda: all(any(h.is_copy for h in halves_of(t)) for t in lost))
        # one of them decided meanwhile by an earlier checker's COMMIT, after its put-back
        originals = {t: [h for h in halves_of(t) if not h.is_copy] for t in lost}
        [late] = originals[decided]
        op = OpRecord(
            txn_id=decided,
            state=OpState.COMMIT,
            producer_group=outbox_settings.producer_group,
            half_partition=late.partition,
            half_offsets=(late.offset,),
            decided_by=DecidedBy.CHECKER,
            decided_at_ms=int(time.time() * 1000),
        )
        writer = Producer({"bootstrap.servers": kafka_bootstrap})
        key, value = encode_op(op)
        writer.produce(names.op, key=key, value=value, partition=late.partition)
        assert writer.flush(30) == 0
        wait_for(lambda: placed[decided] in delivered())
        # When retention removes every original half record (the copies stay)
        partition = late.partition
        first_copy = min(h.offset for t in lost for h in halves_of(t) if h.is_copy)
        assert max(h.offset for hs in originals.values() for h in hs) < first_copy
        assert delete_below(kafka_bootstrap, names.half, partition, first_copy) == first_copy
        if before is not None:  # the group's committed position is below the log start now
            assert committed_half(kafka_bootstrap, group, names.half, partition) < first_copy
        if history == "restarted-while-pending":
            # A checker that took them up but could not ask (no producer answered checks yet)
            # commits its half position at the oldest original, below the log start: its
            # restart reads the copies again and takes them up again
            oldest = min(h.offset for t in (committed, rolled_back) for h in originals[t])
            with running(Checker(checker_settings(kafka_bootstrap, prefix, group_id=group))):
                wait_for(
                    lambda: committed_half(kafka_bootstrap, group, names.half, partition) == oldest
                )
            producer.serve_checks(engine=engine, secret=SECRET)
        # and the checker group starts
        checker = Checker(checker_settings(kafka_bootstrap, prefix, group_id=group))
        with running(checker):

            def ops_of(txn_id: str) -> list[OpRecord]:
                return [o for o in topics.ops() if o.txn_id == txn_id]

            # Then each undecided transaction is decided by the checker, as its database says
            wait_for(lambda: bool(ops_of(committed)) and bool(ops_of(rolled_back)), timeout=45)
            wait_for(lambda: placed[committed] in delivered())
            time.sleep(3)  # a duplicate or a second decision would show up now
            assert checker.stats.orphans == 2
        for txn_id, state in [(committed, OpState.COMMIT), (rolled_back, OpState.ROLLBACK)]:
            [op] = ops_of(txn_id)
            assert (op.state, op.decided_by) == (state, DecidedBy.CHECKER)
            assert list(op.half_offsets) == [h.offset for h in originals[txn_id]]
        # the one decided before is not decided again
        assert [(o.state, o.decided_by) for o in ops_of(decided)] == [
            (OpState.COMMIT, DecidedBy.CHECKER)
        ]
    # and a read_committed consumer of the real topic received each committed order once
    expected = [placed[committed], placed[decided]] + ([placed[before]] if before else [])
    assert delivered() == sorted(expected)
    assert [i for i in order_ids(engine) if i in placed.values()] == sorted(expected)


@pytest.mark.scale  # retention overtaking a reader (~45 s): the scale stage
def test_a_checker_overtaken_by_retention_while_reading_starts_over_and_misses_nothing(
    kafka_bootstrap: str, outbox_settings: OutboxSettings, topics: Topics
) -> None:
    """Retention can remove records a running checker has not read yet (a backlog read slower
    than the log is deleted). The checker starts over rather than jumping over them silently,
    and the next session takes up the transactions known only by their copies."""
    prefix, names = outbox_settings.topic_prefix, outbox_settings.topics
    writer = Writer(outbox_settings, group="orders")
    asked, released = threading.Event(), threading.Event()

    def answer(message: MessageView) -> LocalTransactionState:
        if message.value == b"slow":  # holds the checker's loop in its round
            asked.set()
            released.wait(40)
            return LocalTransactionState.ROLLBACK
        return LocalTransactionState.COMMIT

    service = orders_group(outbox_settings)
    service.serve_checks(resolver=FunctionResolver(answer, answer_timeout_s=45), secret=SECRET)
    # Given a checker whose consumer reads ahead by about one record (so what it has not read
    # yet is still on the broker only)
    slow = writer.halves("orders", [b"slow"])
    settings = checker_settings(
        kafka_bootstrap,
        prefix,
        request_timeout_s=50,
        kafka={
            "queued.max.messages.kbytes": 1,
            "queued.min.messages": 1,
            "max.partition.fetch.bytes": 1024,
        },
    )
    checker = Checker(settings)
    try:
        with running(checker):
            assert asked.wait(30), "the slow transaction was never checked"
            # and, while it waits for an answer, traffic: transactions decided at once
            for _ in range(100):
                writer.op(writer.halves("orders", [b"x" * 2048]), OpState.COMMIT)
            # then one whose op was lost, put back by the relay
            lost = writer.halves("orders", [b"lost"])
            [copy] = writer.put_back(lost)
            assert lost.partition == slow.partition
            # When retention removes everything before the copy, unread by the checker
            assert delete_below(kafka_bootstrap, names.half, lost.partition, copy) == copy
            released.set()

            def ops_of(txn_id: str) -> list[OpRecord]:
                return [o for o in topics.ops() if o.txn_id == txn_id]

            # Then the transaction is decided from its copy, as its producer answers
            wait_for(lambda: bool(ops_of(lost.txn_id)), timeout=45)
            time.sleep(2)
            [op] = ops_of(lost.txn_id)
            assert (op.state, op.decided_by) == (OpState.COMMIT, DecidedBy.CHECKER)
            assert list(op.half_offsets) == lost.offsets
            assert [o.state for o in ops_of(slow.txn_id)] == [OpState.ROLLBACK]
            assert checker.stats.orphans == 1
    finally:
        released.set()
        service.close()


def test_a_committed_position_past_the_partitions_end_is_read_from_its_beginning(
    kafka_bootstrap: str, outbox_settings: OutboxSettings, topics: Topics
) -> None:
    """A half log cut back below the group's committed offset (an unclean leader election, the
    topic made again): read from its beginning, not started over for ever on the same offset."""
    prefix, names = outbox_settings.topic_prefix, outbox_settings.topics
    service = orders_group(outbox_settings)
    service.serve_checks(
        resolver=FunctionResolver(lambda message: LocalTransactionState.COMMIT), secret=SECRET
    )
    try:
        # Given a transaction whose op was lost, and a checker group whose committed position
        # lies past the end of its partition
        lost = Writer(outbox_settings, group="orders").halves("orders", [b"lost"])
        settings = checker_settings(kafka_bootstrap, prefix)
        group = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": settings.group_id})
        try:
            past_the_end = TopicPartition(names.half, lost.partition, 1_000)
            group.commit(offsets=[past_the_end], asynchronous=False)
        finally:
            group.close()
        # When the group's checker starts, Then it decides the transaction
        with running(Checker(settings)):
            wait_for(lambda: any(o.txn_id == lost.txn_id for o in topics.ops()), timeout=45)
        [op] = [o for o in topics.ops() if o.txn_id == lost.txn_id]
        assert (op.state, op.decided_by) == (OpState.COMMIT, DecidedBy.CHECKER)
    finally:
        service.close()

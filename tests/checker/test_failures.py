"""Failures the checker must see through: killed producers, skewed clocks, endpoints that go."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka import Producer
from sqlalchemy.orm import Session, sessionmaker

from checker import Checker
from checker.rounds import with_records
from checker.tracker import Pending
from outbox import LocalTransactionState, MessageView, OutboxProducer, OutboxSettings
from outbox.checks.listener import FunctionResolver
from outbox.fetch import HalfFetcher
from outbox.protocol import (
    DecidedBy,
    HalfMessage,
    HalfRecord,
    OpState,
    encode_half_headers,
    new_transaction_id,
    why_incomplete,
)
from tests.checker.test_checker import (
    SECRET,
    Background,
    checker_and_relay,
    checker_settings,
    wait_for,
)
from tests.kafka_helpers import create_topic, set_topic_config, unique
from tests.producer_fixtures import Topics
from tests.relay.test_relay import read_topic

pytestmark = pytest.mark.integration
CHILD = Path(__file__).with_name("crashing_producer.py")


def run_child_until_killed(args: list[str]) -> str:
    child = subprocess.Popen(
        [sys.executable, str(CHILD), *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(CHILD.parents[2])},
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    child.send_signal(signal.SIGKILL)
    child.wait(30)
    assert line.startswith("READY "), line
    return line.split()[1]


def orphaned(bootstrap: str, prefix: str, session_factory: Any, *values: bytes) -> str:
    """A committed transaction of group "gone": its op never sent, and no instance of the group
    ever serves checks. Returns its id."""
    orphan = OutboxProducer(
        OutboxSettings(
            bootstrap_servers=bootstrap, producer_group="gone", topic_prefix=prefix, partitions=3
        )
    )
    orphan.kafka.send_op = lambda op: False  # type: ignore[method-assign]
    with orphan.transaction(session_factory) as txn:
        for value in values:
            txn.send("orders", value, key=b"b")
    orphan.close()
    return txn.txn_id


def write_halves(
    producer: Producer,
    half_topic: str,
    txn_id: str,
    messages: dict[int, HalfMessage],
    count: int | None = None,
) -> list[int]:
    """Half records of ``txn_id`` in group "orders" at partition 0, as a producer writes them
    (``messages`` by message index), acknowledged; their offsets in that order."""
    offsets: dict[int, int] = {}
    for index, message in messages.items():
        headers = encode_half_headers(
            txn_id=txn_id,
            producer_group="orders",
            message=message,
            index=index,
            count=count,
            created_at_ms=0,
        )
        producer.produce(
            half_topic,
            message.value,
            txn_id.encode(),
            0,
            headers=headers,
            on_delivery=lambda err, msg, i=index: offsets.__setitem__(i, msg.offset()),
        )
    assert producer.flush(10) == 0
    return [offsets[index] for index in messages]


@pytest.mark.processes
@pytest.mark.parametrize("moment", ["after-commit", "before-commit"])
def test_producer_killed_around_its_commit_is_resolved_by_the_checker(
    kafka_bootstrap: str,
    db_url: str,
    outbox_settings: OutboxSettings,
    producer: OutboxProducer,
    engine: sa.Engine,
    topics: Topics,
    moment: str,
) -> None:
    topic, prefix = unique("orders"), outbox_settings.topic_prefix
    # Another live instance of the same service answers checks from the same database
    producer.serve_checks(engine=engine, secret=SECRET)
    txn_id = run_child_until_killed([kafka_bootstrap, prefix, db_url, topic, moment])
    with checker_and_relay(kafka_bootstrap, prefix):
        wait_for(lambda: any(o.txn_id == txn_id for o in topics.ops()), timeout=60)
        [op] = [o for o in topics.ops() if o.txn_id == txn_id]
        if moment == "after-commit":
            assert (op.state, op.decided_by) == (OpState.COMMIT, DecidedBy.CHECKER)
            wait_for(lambda: len(read_topic(kafka_bootstrap, topic)) >= 1)
        else:
            assert (op.state, op.decided_by) == (OpState.ROLLBACK, DecidedBy.CHECKER)
        time.sleep(2)
        values = [m.value().decode() for m in read_topic(kafka_bootstrap, topic)]
        assert values == ([f"{moment}-{txn_id}"] if moment == "after-commit" else [])


@pytest.mark.parametrize("skew_s", [-300, 300])
def test_check_timing_uses_broker_time_not_the_producers_clock(
    kafka_bootstrap: str, outbox_settings: OutboxSettings, skew_s: int
) -> None:
    prefix = outbox_settings.topic_prefix
    asked: dict[str, float] = {}

    def answer(msg: MessageView) -> LocalTransactionState:
        asked.setdefault(msg.transaction_id, time.time())
        return LocalTransactionState.ROLLBACK

    endpoint = OutboxProducer(outbox_settings)
    endpoint.serve_checks(resolver=FunctionResolver(answer), secret=SECRET)
    checker = Background(
        Checker(checker_settings(kafka_bootstrap, prefix, transaction_timeout_s=4))
    )
    try:
        # Given a producer whose clock is 5 minutes off: its record timestamp and header lie
        raw = Producer({"bootstrap.servers": kafka_bootstrap})
        txn_id, skewed_ms = new_transaction_id(), int((time.time() + skew_s) * 1000)
        headers = encode_half_headers(
            txn_id=txn_id,
            producer_group="orders",
            message=HalfMessage("orders", b"x"),
            index=0,
            count=1,
            created_at_ms=skewed_ms,
        )
        raw.produce(
            outbox_settings.topics.half,
            key=txn_id.encode(),
            value=b"x",
            headers=headers,
            partition=0,
            timestamp=skewed_ms,
        )
        raw.flush(10)
        sent = time.time()
        wait_for(lambda: txn_id in asked, timeout=30)
        # Then it is checked after the transaction timeout of broker time, neither early nor late
        assert 4 - 0.5 <= asked[txn_id] - sent <= 4 + 3
    finally:
        checker.stop()
        endpoint.close()


def test_endpoint_down_then_up_resolves_without_burning_checks_and_a_gone_group_is_given_up(
    kafka_bootstrap: str,
    outbox_settings: OutboxSettings,
    producer: OutboxProducer,
    engine: sa.Engine,
    session_factory: Any,
    topics: Topics,
) -> None:
    prefix = outbox_settings.topic_prefix
    settings = checker_settings(kafka_bootstrap, prefix, check_max=2, no_producer_timeout_s=4)
    checker = Checker(settings)
    running = Background(checker)
    try:
        down = producer.serve_checks(engine=engine, secret=SECRET)
        producer.kafka.send_op = lambda op: False  # type: ignore[method-assign]
        with producer.transaction(session_factory) as committed:
            committed.send("orders", b"resolved-later", key=b"a")
        down.close()  # registered, but nobody answers
        time.sleep(4)
        assert checker.stats.unreachable > 0 and checker.stats.checks == 0
        assert not topics.ops()
        producer.serve_checks(engine=engine, secret=SECRET)  # back up
        wait_for(lambda: any(o.txn_id == committed.txn_id for o in topics.ops()))
        [op] = topics.ops()
        assert (op.state, op.decided_by) == (OpState.COMMIT, DecidedBy.CHECKER)

        # A group all of whose instances are gone is given up after the limit
        orphaned(kafka_bootstrap, prefix, session_factory, b"orphan")
        wait_for(lambda: checker.stats.given_up >= 1, timeout=30)
        letters = read_topic(kafka_bootstrap, outbox_settings.topics.dead_letter)
        assert [m.value() for m in letters] == [b"orphan"]
        assert b"no producer of group 'gone'" in dict(letters[0].headers())["outbox-dl-reason"]
    finally:
        running.stop()


def test_two_checkers_and_a_restarted_one_never_decide_a_transaction_twice_differently(
    kafka_bootstrap: str,
    outbox_settings: OutboxSettings,
    producer: OutboxProducer,
    engine: sa.Engine,
    session_factory: Any,
    topics: Topics,
) -> None:
    prefix = outbox_settings.topic_prefix
    producer.serve_checks(engine=engine, secret=SECRET)
    producer.kafka.send_op = lambda op: False  # type: ignore[method-assign]
    expected: dict[str, OpState] = {}
    for i in range(40):
        try:
            with producer.transaction(session_factory) as txn:
                txn.send("orders", f"m{i}", key=f"k{i}")
                if i % 2:
                    raise ValueError
            expected[txn.txn_id] = OpState.COMMIT
        except ValueError:
            expected[txn.txn_id] = OpState.ROLLBACK
    group = unique("checker")
    first = Background(Checker(checker_settings(kafka_bootstrap, prefix, group_id=group)))
    second = Background(Checker(checker_settings(kafka_bootstrap, prefix, group_id=group)))
    time.sleep(1.5)
    first.stop()  # a restart in the middle
    third = Background(Checker(checker_settings(kafka_bootstrap, prefix, group_id=group)))
    try:
        wait_for(lambda: {o.txn_id for o in topics.ops()} >= set(expected), timeout=60)
        time.sleep(2)
    finally:
        second.stop()
        third.stop()
    decisions: dict[str, set[OpState]] = defaultdict(set)
    for op in topics.ops():
        decisions[op.txn_id].add(op.state)
    assert {t: s for t, s in decisions.items()} == {t: {s} for t, s in expected.items()}


def test_a_storm_of_unknown_answers_trips_the_breaker_instead_of_burning_checks(
    kafka_bootstrap: str, outbox_settings: OutboxSettings
) -> None:
    prefix = outbox_settings.topic_prefix
    calls: list[str] = []

    def unknown(msg: MessageView) -> LocalTransactionState:
        calls.append(msg.transaction_id)
        return LocalTransactionState.UNKNOWN

    endpoint = OutboxProducer(outbox_settings)
    endpoint.serve_checks(resolver=FunctionResolver(unknown), secret=SECRET)
    raw = Producer({"bootstrap.servers": kafka_bootstrap})
    for _ in range(30):
        txn_id = new_transaction_id()
        headers = encode_half_headers(
            txn_id=txn_id,
            producer_group="orders",
            message=HalfMessage("orders", b"x"),
            index=0,
            count=1,
            created_at_ms=0,
        )
        raw.produce(
            outbox_settings.topics.half,
            key=txn_id.encode(),
            value=b"x",
            headers=headers,
            partition=0,
        )
    raw.flush(10)
    checker = Checker(checker_settings(kafka_bootstrap, prefix, check_max=2, breaker_cooldown_s=60))
    running = Background(checker)
    try:
        wait_for(lambda: checker.stats.breaker_trips == 1, timeout=30)
        asked = len(calls)
        time.sleep(4)  # several check intervals pass while the breaker is open
        assert len(calls) == asked == 30
        assert checker.stats.given_up == 0
    finally:
        running.stop()
        endpoint.close()


def test_a_half_the_checker_had_not_read_when_the_producer_answered_is_in_its_commit(
    kafka_bootstrap: str, outbox_settings: OutboxSettings, topics: Topics
) -> None:
    """A lagging checker asks about a transaction having read only its first half; the
    producer committed after its second was acknowledged, so the COMMIT must list both."""
    prefix, half_topic = outbox_settings.topic_prefix, outbox_settings.topics.half
    real = unique("orders")
    raw = Producer({"bootstrap.servers": kafka_bootstrap})
    txn_id = new_transaction_id()
    offsets: list[int] = []

    def write_half(index: int) -> None:  # sent one by one: the op's list is the count
        message = HalfMessage(real, f"{index}".encode(), b"k")
        offsets.extend(write_halves(raw, half_topic, txn_id, {index: message}))

    def answer(asked: MessageView) -> LocalTransactionState:
        if len(offsets) == 1:
            write_half(1)  # acknowledged before the local commit the answer reports
        return LocalTransactionState.COMMIT

    endpoint = OutboxProducer(outbox_settings)
    endpoint.serve_checks(resolver=FunctionResolver(answer), secret=SECRET)
    write_half(0)
    try:
        with checker_and_relay(kafka_bootstrap, prefix):
            wait_for(lambda: any(o.txn_id == txn_id for o in topics.ops()), timeout=30)
            [op] = topics.ops()
            assert (op.state, op.decided_by) == (OpState.COMMIT, DecidedBy.CHECKER)
            assert op.half_offsets == tuple(offsets) and len(offsets) == 2
            wait_for(lambda: len(read_topic(kafka_bootstrap, real)) >= 2, timeout=30)
            time.sleep(1)
            assert sorted(m.value() for m in read_topic(kafka_bootstrap, real)) == [b"0", b"1"]
    finally:
        endpoint.close()


@pytest.mark.parametrize(
    ("written", "count", "why"),
    [
        ((0, 2), None, "1 of its 3 messages is missing (index 1)"),
        ((0,), 2, "1 of its 2 messages is missing (index 1)"),
    ],
    ids=["gap", "short-of-its-count"],
)
def test_a_commit_answer_for_a_transaction_with_missing_halves_is_given_up_never_delivered_in_part(
    kafka_bootstrap: str,
    outbox_settings: OutboxSettings,
    topics: Topics,
    written: tuple[int, ...],
    count: int | None,
    why: str,
) -> None:
    """Its producer committed, but a half record is not on the half topic (removed, or never
    written): a COMMIT naming the others would deliver part of the transaction."""
    prefix, half_topic = outbox_settings.topic_prefix, outbox_settings.topics.half
    real = unique("orders")
    raw = Producer({"bootstrap.servers": kafka_bootstrap})
    txn_id = new_transaction_id()
    messages = {index: HalfMessage(real, f"{index}".encode(), b"k") for index in written}
    write_halves(raw, half_topic, txn_id, messages, count)
    endpoint = OutboxProducer(outbox_settings)
    endpoint.serve_checks(
        resolver=FunctionResolver(lambda asked: LocalTransactionState.COMMIT), secret=SECRET
    )
    try:
        with checker_and_relay(kafka_bootstrap, prefix) as checker:
            wait_for(lambda: any(o.txn_id == txn_id for o in topics.ops()), timeout=30)
            [op] = topics.ops()
            assert (op.state, op.decided_by) == (OpState.GIVEN_UP, DecidedBy.CHECKER)
            assert op.reason == (
                f"its producer answered COMMIT, but {why}; delivering the rest would deliver "
                "part of the transaction: re-send its messages from their source"
            )
            wait_for(lambda: checker.stats.given_up == 1, timeout=10)
            assert checker.stats.incomplete == 1 and checker.stats.resolved_commit == 0
            letters = read_topic(kafka_bootstrap, outbox_settings.topics.dead_letter)
            assert sorted(m.value() for m in letters) == [f"{i}".encode() for i in written]
    finally:
        endpoint.close()


def test_a_resumed_transaction_held_in_part_fetches_its_other_copies_before_deciding(
    kafka_bootstrap: str, outbox_settings: OutboxSettings
) -> None:
    """The checker reads the half and op topics together, so of a resume's copies some can be
    read before its RESUMED op (ignored: still given up then) and the rest after. The ones it
    lacks are fetched at the op's offsets; before, it fetched only when it held none, and a
    COMMIT answer then found the transaction incomplete."""
    half_topic = outbox_settings.topics.half
    raw = Producer({"bootstrap.servers": kafka_bootstrap})
    txn_id = new_transaction_id()
    copies = [HalfMessage("orders", f"{index}".encode(), b"k") for index in (0, 1)]
    offsets = write_halves(raw, half_topic, txn_id, dict(enumerate(copies)))
    fetcher = HalfFetcher({"bootstrap.servers": kafka_bootstrap}, half_topic)
    entry = Pending(txn_id, "orders", 0, resumed_offsets=tuple(offsets))
    entry.records[1] = HalfRecord(
        txn_id, "orders", copies[1], 1, None, 0, 0, partition=0, offset=offsets[1]
    )
    try:
        assert why_incomplete(entry.records.values()) == "1 of its 2 messages is missing (index 0)"
        with_records(entry, fetcher)
        assert why_incomplete(entry.records.values()) is None
        assert entry.offsets == offsets
        assert entry.records[0].message.value == b"0"
    finally:
        fetcher.close()


class _LostAck(RuntimeError):
    """The connection dropped after the database committed: the caller sees a failure."""


@pytest.mark.parametrize("outcome", ["refused-at-commit", "committed-unacknowledged"])
def test_a_db_commit_that_raises_leaves_the_outcome_to_the_checker_which_finds_the_truth(
    kafka_bootstrap: str,
    db_url: str,
    outbox_settings: OutboxSettings,
    producer: OutboxProducer,
    engine: sa.Engine,
    topics: Topics,
    outcome: str,
) -> None:
    """Whether a failed COMMIT committed is unknown to the producer; the evidence row knows."""
    # A child row whose foreign key is checked at COMMIT (deferred) makes the database refuse it
    metadata = sa.MetaData()
    parent = sa.Table(unique("parent"), metadata, sa.Column("id", sa.Integer, primary_key=True))
    child = sa.Table(
        unique("child"),
        metadata,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column(
            "parent_id",
            sa.ForeignKey(parent.c.id, deferrable=True, initially="DEFERRED"),
            nullable=False,
        ),
    )
    strict = sa.create_engine(db_url)
    if strict.dialect.name == "sqlite":
        sa.event.listen(strict, "connect", lambda conn, _: conn.execute("PRAGMA foreign_keys=ON"))
    metadata.create_all(strict)
    sessions = sessionmaker(strict)
    if outcome == "committed-unacknowledged":

        def lose_the_ack(session: Session) -> None:
            raise _LostAck("connection lost after COMMIT")

        sa.event.listen(sessions, "after_commit", lose_the_ack)
    producer.serve_checks(engine=engine, secret=SECRET)
    real = unique("orders")
    create_topic(kafka_bootstrap, real)
    expected_error = sa.exc.IntegrityError if outcome == "refused-at-commit" else _LostAck
    with pytest.raises(expected_error), producer.transaction(sessions) as txn:
        txn.session.execute(child.insert().values(id=1, parent_id=1))
        if outcome == "committed-unacknowledged":
            txn.session.execute(parent.insert().values(id=1))
        txn.send(real, b"order", key=b"k")
    # The producer wrote no op: it cannot know; the checker asks and the evidence row answers
    assert not topics.ops()
    try:
        with checker_and_relay(kafka_bootstrap, outbox_settings.topic_prefix):
            wait_for(lambda: any(o.txn_id == txn.txn_id for o in topics.ops()), timeout=60)
            [op] = topics.ops()
            if outcome == "refused-at-commit":
                assert (op.state, op.decided_by) == (OpState.ROLLBACK, DecidedBy.CHECKER)
                time.sleep(2)
                assert read_topic(kafka_bootstrap, real) == []
            else:
                assert (op.state, op.decided_by) == (OpState.COMMIT, DecidedBy.CHECKER)
                wait_for(lambda: len(read_topic(kafka_bootstrap, real)) >= 1)
                time.sleep(1)
                assert [m.value() for m in read_topic(kafka_bootstrap, real)] == [b"order"]
            with strict.connect() as conn:
                children = conn.execute(sa.select(sa.func.count()).select_from(child)).scalar()
            assert children == (1 if outcome == "committed-unacknowledged" else 0)
    finally:
        strict.dispose()


def test_a_decision_the_op_topic_refuses_is_checked_again_and_written_once_it_is_taken(
    kafka_bootstrap: str,
    outbox_settings: OutboxSettings,
    producer: OutboxProducer,
    engine: sa.Engine,
    session_factory: Any,
    topics: Topics,
) -> None:
    """An op the broker never took is no decision: before, the checker counted the transaction
    decided and never asked again while it ran, and the relay held its halves forever."""
    op_topic = outbox_settings.topics.op
    # no op fits (200 bytes): its transaction markers (some 80 bytes) still must, or the broker
    # cannot end the checker's Kafka transactions on the topic at all
    set_topic_config(kafka_bootstrap, op_topic, "max.message.bytes", "200")
    producer.serve_checks(engine=engine, secret=SECRET)
    producer.kafka.send_op = lambda op: False  # type: ignore[method-assign]
    with producer.transaction(session_factory) as txn:
        txn.send("orders", b"decided-when-written", key=b"a")
    checker = Checker(checker_settings(kafka_bootstrap, outbox_settings.topic_prefix))
    running = Background(checker)
    try:
        # Given the checker's COMMIT refused by the op topic: it is pending again, and says so
        wait_for(lambda: checker.stats.write_failures >= 1, timeout=30)
        assert not topics.ops()
        wait_for(lambda: txn.txn_id in checker.tracker.pending, timeout=10)
        # When the op topic takes records again, the transaction is checked again and decided
        set_topic_config(kafka_bootstrap, op_topic, "max.message.bytes", "1048588")
        wait_for(lambda: any(o.txn_id == txn.txn_id for o in topics.ops()), timeout=30)
        time.sleep(2)
        [op] = topics.ops()
        assert (op.state, op.decided_by) == (OpState.COMMIT, DecidedBy.CHECKER)
        assert checker.stats.resolved_commit == 1  # the op taken, not the attempts
        assert txn.txn_id not in checker.tracker.pending
    finally:
        running.stop()


def test_a_give_up_the_op_topic_refuses_is_repeated_without_copying_its_records_twice(
    kafka_bootstrap: str,
    outbox_settings: OutboxSettings,
    session_factory: Any,
    topics: Topics,
) -> None:
    """Before, each repeated give-up wrote every dead-letter copy again and counted the
    transaction given up again."""
    prefix, op_topic = outbox_settings.topic_prefix, outbox_settings.topics.op
    # no op fits (200 bytes): its transaction markers (some 80 bytes) still must, or the broker
    # cannot end the checker's Kafka transactions on the topic at all
    set_topic_config(kafka_bootstrap, op_topic, "max.message.bytes", "200")
    lost = orphaned(kafka_bootstrap, prefix, session_factory, b"first", b"second")
    checker = Checker(checker_settings(kafka_bootstrap, prefix, no_producer_timeout_s=2))
    running = Background(checker)
    try:
        # Given a group nobody answers for, given up while the op topic refuses the GIVEN_UP op
        # (given up again at each check, each time refused)
        wait_for(lambda: checker.stats.write_failures >= 3, timeout=60)
        assert not topics.ops()
        assert checker.stats.given_up == 0
        # When the op topic takes records again, the give-up is written once
        set_topic_config(kafka_bootstrap, op_topic, "max.message.bytes", "1048588")
        wait_for(lambda: any(o.txn_id == lost for o in topics.ops()), timeout=30)
        time.sleep(2)
        [op] = topics.ops()
        assert (op.state, op.decided_by) == (OpState.GIVEN_UP, DecidedBy.CHECKER)
        # and each record was copied to the dead-letter topic once
        letters = read_topic(kafka_bootstrap, outbox_settings.topics.dead_letter)
        assert sorted(m.value() for m in letters) == [b"first", b"second"]
        assert checker.stats.given_up == 1
    finally:
        running.stop()


@pytest.mark.processes
@pytest.mark.parametrize("replaced", [True, False], ids=["replaced", "gone"])
def test_a_sigkilled_instance_of_a_group_is_failed_over_or_its_group_given_up_after_the_ttl(
    kafka_bootstrap: str,
    db_url: str,
    outbox_settings: OutboxSettings,
    producer: OutboxProducer,
    engine: sa.Engine,
    topics: Topics,
    replaced: bool,
) -> None:
    """SIGKILL leaves no tombstone: the dead instance stays registered until the registry TTL,
    and its port refuses connections."""
    topic, prefix = unique("orders"), outbox_settings.topic_prefix
    moment = "serving-after-commit"
    txn_id = run_child_until_killed([kafka_bootstrap, prefix, db_url, topic, moment])
    if replaced:
        producer.serve_checks(engine=engine, secret=SECRET)  # its replacement, at once
    settings = checker_settings(
        kafka_bootstrap, prefix, registry_ttl_s=8 if replaced else 3, no_producer_timeout_s=6
    )
    checker = Checker(settings)
    running = Background(checker)
    try:
        wait_for(lambda: any(o.txn_id == txn_id for o in topics.ops()), timeout=60)
        [op] = [o for o in topics.ops() if o.txn_id == txn_id]
        if replaced:
            # The dead registration is skipped over: the replacement answers from the database
            assert (op.state, op.decided_by) == (OpState.COMMIT, DecidedBy.CHECKER)
            assert checker.stats.given_up == 0
        else:
            # Once its registration expires the group has no live instance, and is given up
            assert op.state is OpState.GIVEN_UP
            assert op.reason is not None and "no producer of group 'orders'" in op.reason
            assert "no live instance" in op.reason  # not its refused port: it expired
            [letter] = read_topic(kafka_bootstrap, outbox_settings.topics.dead_letter)
            assert letter.value() == f"{moment}-{txn_id}".encode()
    finally:
        running.stop()

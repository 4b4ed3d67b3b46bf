"""The decorator and context-manager forms on PostgreSQL and SQLite with a real broker."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

import outbox
from outbox import OutboxProducer, OutboxSettings
from outbox.protocol import DecidedBy, Header, OpState, partition_for
from tests.producer_fixtures import Topics, evidence_ids, order_ids, orders

pytestmark = pytest.mark.integration


def _id() -> str:
    return f"order-{uuid.uuid4().hex[:12]}"


class Boom(Exception):
    pass


def test_commit_stores_the_row_the_evidence_the_half_and_a_commit_op(
    producer: OutboxProducer, session_factory: sessionmaker, engine: sa.Engine, topics: Topics
) -> None:
    order_id = _id()

    @outbox.transactional(producer=producer, session_factory=session_factory)
    def place(order_id: str, *, session: Session) -> str:
        session.execute(orders.insert().values(id=order_id, amount=5))
        outbox.send("orders", b'{"amount": 5}', key=order_id, headers={"trace": "t1"})
        return outbox.current_transaction().txn_id

    txn_id = place(order_id)

    assert order_id in order_ids(engine)
    assert evidence_ids(engine)[txn_id] == "evidence"
    [half] = [h for h in topics.halves() if h.txn_id == txn_id]
    assert half.message.topic == "orders"
    assert half.message.key == order_id.encode()
    assert half.message.value == b'{"amount": 5}'
    assert half.message.headers == (("trace", b"t1"),)
    assert half.index == 0 and half.producer_group == "orders" and half.check_count == 0
    assert half.partition == partition_for(order_id.encode(), 3)
    [op] = [o for o in topics.ops() if o.txn_id == txn_id]
    assert op.state is OpState.COMMIT and op.decided_by is DecidedBy.PRODUCER
    assert (op.partition, op.half_partition, op.half_offsets) == (
        half.partition,
        half.partition,
        (half.offset,),
    )


@pytest.mark.parametrize("version", [1, 2])
def test_the_producer_writes_half_records_in_the_schema_version_it_is_set_to(
    outbox_settings: OutboxSettings, session_factory: sessionmaker, topics: Topics, version: int
) -> None:
    # OUTBOX_HALF_SCHEMA_VERSION=1 keeps producers readable by readers not yet upgraded.
    order_id = _id()
    with OutboxProducer(replace(outbox_settings, half_schema_version=version)) as producer:

        @outbox.transactional(producer=producer, session_factory=session_factory)
        def place(order_id: str, *, session: Session) -> str:
            session.execute(orders.insert().values(id=order_id, amount=5))
            outbox.send("orders", b"{}", key=order_id, headers={"trace": "t1"})
            outbox.send("orders", b"{}", key=None)
            return outbox.current_transaction().txn_id

        txn_id = place(order_id)

    halves = [h for h in topics.halves() if h.txn_id == txn_id]
    assert [h.schema_version for h in halves] == [version, version]
    ours = {n for h in halves for n, _ in h.raw_headers if n.startswith("outbox-")}
    assert ("outbox-half" in ours) is (version == 2)
    assert ("outbox-txn-id" in ours) is (version == 1)
    assert [(h.index, h.message.key, h.producer_group) for h in halves] == [
        (0, order_id.encode(), "orders"),
        (1, None, "orders"),
    ]
    assert halves[0].message.headers == (("trace", b"t1"),)


def test_exception_rolls_back_the_db_writes_a_rollback_op_and_reraises(
    producer: OutboxProducer, session_factory: sessionmaker, engine: sa.Engine, topics: Topics
) -> None:
    order_id = _id()
    seen: list[str] = []

    @outbox.transactional(producer=producer, session_factory=session_factory)
    def place(*, session: Session) -> None:
        session.execute(orders.insert().values(id=order_id, amount=1))
        outbox.send("orders", b"x", key=order_id)
        seen.append(outbox.current_transaction().txn_id)
        raise Boom("payment declined")

    with pytest.raises(Boom, match="payment declined"):
        place()

    assert order_id not in order_ids(engine)
    assert seen[0] not in evidence_ids(engine)
    [op] = [o for o in topics.ops() if o.txn_id == seen[0]]
    assert op.state is OpState.ROLLBACK


def test_context_manager_commits_on_exit_and_rolls_back_on_error(
    producer: OutboxProducer, session_factory: sessionmaker, engine: sa.Engine, topics: Topics
) -> None:
    kept, dropped = _id(), _id()
    with producer.transaction(session_factory) as txn:
        assert txn.session is not None
        txn.session.execute(orders.insert().values(id=kept, amount=2))
        txn.send("orders", b"kept", key=kept)
    with pytest.raises(Boom), producer.transaction(session_factory) as failed:
        assert failed.session is not None
        failed.session.execute(orders.insert().values(id=dropped, amount=3))
        failed.send("orders", b"dropped", key=dropped)
        raise Boom

    assert kept in order_ids(engine) and dropped not in order_ids(engine)
    states = {o.txn_id: o.state for o in topics.ops()}
    assert states == {txn.txn_id: OpState.COMMIT, failed.txn_id: OpState.ROLLBACK}


def test_several_messages_share_one_partition_and_one_op_in_send_order(
    producer: OutboxProducer, session_factory: sessionmaker, topics: Topics
) -> None:
    with producer.transaction(session_factory) as txn:
        txn.send("orders", b"first", key="k-1")
        txn.send("payments", b"second", key="other-key")
        txn.send("orders", b"third")

    halves = sorted((h for h in topics.halves() if h.txn_id == txn.txn_id), key=lambda h: h.index)
    [op] = topics.ops()
    assert [h.message.value for h in halves] == [b"first", b"second", b"third"]
    assert [h.index for h in halves] == [0, 1, 2]
    assert {h.partition for h in halves} == {partition_for(b"k-1", 3)}
    assert op.half_offsets == tuple(h.offset for h in halves)
    assert op.message_count == 3


def test_nested_decorated_calls_join_the_outer_transaction(
    producer: OutboxProducer, session_factory: sessionmaker, engine: sa.Engine, topics: Topics
) -> None:
    outer_id, inner_id = _id(), _id()
    txn_ids: list[str] = []

    @outbox.transactional(producer=producer, session_factory=session_factory)
    def inner(*, session: Session) -> None:
        txn_ids.append(outbox.current_transaction().txn_id)
        session.execute(orders.insert().values(id=inner_id, amount=1))
        outbox.send("orders", b"inner", key=inner_id)

    @outbox.transactional(producer=producer, session_factory=session_factory)
    def outer(fail: bool, *, session: Session) -> None:
        txn_ids.append(outbox.current_transaction().txn_id)
        session.execute(orders.insert().values(id=outer_id, amount=1))
        outbox.send("orders", b"outer", key=outer_id)
        inner()
        if fail:
            raise Boom

    with pytest.raises(Boom):
        outer(True)
    assert txn_ids[0] == txn_ids[1]
    assert outer_id not in order_ids(engine) and inner_id not in order_ids(engine)
    assert [(o.state, o.message_count) for o in topics.ops()] == [(OpState.ROLLBACK, 2)]


def test_a_fenced_transaction_fails_on_its_evidence_and_rolls_back(
    producer: OutboxProducer, session_factory: sessionmaker, engine: sa.Engine, topics: Topics
) -> None:
    order_id = _id()
    txn_ids: list[str] = []

    @outbox.transactional(producer=producer, session_factory=session_factory)
    def place(*, session: Session) -> None:
        txn_id = outbox.current_transaction().txn_id
        txn_ids.append(txn_id)
        # Given a check that fenced this transaction id before it wrote its evidence
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO outbox_evidence (txn_id, kind, producer_group, created_at) "
                    "VALUES (:t, 'fence', 'orders', CURRENT_TIMESTAMP)"
                ),
                {"t": txn_id},
            )
        outbox.send("orders", b"x", key=order_id)
        session.execute(orders.insert().values(id=order_id, amount=1))

    with pytest.raises(outbox.TransactionFencedError, match="fenced by a check"):
        place()
    assert order_id not in order_ids(engine)
    [op] = topics.ops()
    assert op.state is OpState.ROLLBACK
    # And the ROLLBACK names the half record the send put on the topic (on PostgreSQL the
    # evidence INSERT failed while it travelled), so a relay drops it on reading the op
    [half] = topics.halves()
    assert half.txn_id == op.txn_id == txn_ids[0]
    assert len(op.half_offsets) == 1, op


def test_promoted_header_names_are_reserved_for_the_outbox(
    producer: OutboxProducer, session_factory: sessionmaker, topics: Topics
) -> None:
    with (
        pytest.raises(outbox.InvalidHeaderError, match="outbox-txn-id"),
        producer.transaction(session_factory) as txn,
    ):
        txn.send("orders", b"x", headers=[(Header.TXN_ID.value, b"forged")])
    assert topics.halves() == []


def test_a_batch_is_sent_with_one_wait_and_keeps_its_order_in_one_transaction(
    producer: OutboxProducer, session_factory: sessionmaker, topics: Topics
) -> None:
    @outbox.transactional(producer=producer, session_factory=session_factory)
    def ship(*, session: Session) -> str:
        outbox.send("orders", b"before", key="k-9")
        outbox.send_batch([outbox.Message("orders", f"item-{i}".encode()) for i in range(5)])
        return outbox.current_transaction().txn_id

    txn_id = ship()
    halves = sorted((h for h in topics.halves() if h.txn_id == txn_id), key=lambda h: h.index)
    [op] = [o for o in topics.ops() if o.txn_id == txn_id]
    assert [h.message.value for h in halves] == [b"before"] + [b"item-%d" % i for i in range(5)]
    assert op.half_offsets == tuple(h.offset for h in halves) and op.state is OpState.COMMIT
    with pytest.raises(outbox.InvalidTopicError), producer.transaction(session_factory) as txn:
        txn.send_batch([outbox.Message("fine", b"1"), outbox.Message("bad topic!", b"2")])


def test_by_default_the_op_is_sent_one_way_and_still_arrives(
    outbox_settings: OutboxSettings, session_factory: sessionmaker, topics: Topics
) -> None:
    import dataclasses
    import time

    one_way = OutboxProducer(dataclasses.replace(outbox_settings, wait_for_op=False))
    try:
        with one_way.transaction(session_factory) as txn:
            txn.send("orders", b"x", key="k")
        deadline = time.monotonic() + 30
        while not [o for o in topics.ops() if o.txn_id == txn.txn_id]:
            assert time.monotonic() < deadline, "the one-way op never arrived"
            time.sleep(0.2)
        assert one_way.kafka.ops_sent == 1 and one_way.kafka.ops_failed == 0
    finally:
        one_way.close()

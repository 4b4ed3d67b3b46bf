"""A half record acknowledged without an offset is sent again, never named by nothing.

librdkafka reports a produce it retried, which the broker had already written (its first answer
lost when a leader was killed: DUPLICATE_SEQUENCE_NUMBER on the retry), as delivered at an
unknown offset (``Message.offset()`` is None). The producer kept only the known offsets, so its
transaction committed with a COMMIT op naming no half record (``"offsets":[]``,
``"message_count":0``): the relay dead-letters such an op, and the committed message was lost.
The three-broker fault test met it in CI (one order's message, its half record in the log, the
COMMIT naming nothing). A single broker does not answer that way on demand, so the test hands
the producer librdkafka's real reports with the offset taken out.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

import outbox
from outbox import (
    AsyncTransactionalProducer,
    LocalTransactionState,
    Message,
    OutboxProducer,
    OutboxSettings,
    TransactionalProducer,
    TransactionSendResult,
)
from outbox.acks import Waiter
from outbox.errors import HalfSendError
from outbox.protocol import Header
from outbox.protocol.states import OpState
from relay import RelaySettings
from tests.checker.test_checker import SECRET
from tests.kafka_helpers import WithoutOffset, unique
from tests.outbox.test_asyncio import async_factory
from tests.outbox.test_listener_checks import OrdersListener, Plan
from tests.pipeline import pipeline
from tests.producer_fixtures import Topics, order_ids, orders
from tests.relay.test_relay import RelayThread, read_topic, wait_for

pytestmark = pytest.mark.integration


def offsets_unknown(monkeypatch: pytest.MonkeyPatch, reports: int) -> None:
    """The next ``reports`` successful half deliveries come without their offset."""
    original = Waiter.callback
    left = [reports]

    def callback(self: Waiter, i: int) -> Callable[[Any, Any], None]:
        report = original(self, i)

        def on_delivery(err: Any, msg: Any) -> None:
            if err is None and left[0] > 0:
                left[0] -= 1
                msg = WithoutOffset(msg)
            report(err, msg)

        return on_delivery

    monkeypatch.setattr(Waiter, "callback", callback)


def delivered_once(
    kafka_bootstrap: str, prefix: str, topic: str, txn_id: str, *, count: int = 2
) -> list[bytes]:
    """Run a relay until ``topic`` holds the ``count`` records it promotes, and give the values
    it holds (``read_committed``), after checking each came from ``txn_id`` and nothing went to
    the dead letters."""
    running = RelayThread(
        RelaySettings(
            bootstrap_servers=kafka_bootstrap,
            topic_prefix=prefix,
            group_id=unique("relay"),
            auto_create_topics=True,
        )
    )
    try:
        wait_for(lambda: len(read_topic(kafka_bootstrap, topic)) >= count, 60)
        time.sleep(1)  # a repeat would have come by now
        delivered = read_topic(kafka_bootstrap, topic)
    finally:
        running.stop()
    assert {dict(m.headers())[Header.TXN_ID].decode() for m in delivered} == {txn_id}
    assert running.relay.accounting.dead_lettered == 0
    return sorted(m.value() for m in delivered)


def values(order_id: str) -> list[bytes]:
    return [f"{order_id}/0".encode(), f"{order_id}/1".encode()]


def named_by_its_commit(topics: Topics, txn_id: str, order_id: str, *, records: int = 3) -> None:
    """The transaction's COMMIT names both messages, each at a half record carrying it; the
    half topic holds ``records`` of the transaction's records: the first attempt's copies,
    unnamed, and the two named (one ``send()`` is one attempt: 3; both in one batch: 4)."""
    (op,) = [o for o in topics.ops() if o.txn_id == txn_id]
    assert op.state is OpState.COMMIT
    assert op.message_count == 2 and len(op.half_offsets) == 2, op
    halves = {h.offset: h for h in topics.halves() if h.txn_id == txn_id}
    assert len(halves) == records
    assert [halves[o].message.value for o in op.half_offsets] == values(order_id)


def test_a_half_record_acknowledged_without_an_offset_is_sent_again_and_delivered_once(
    kafka_bootstrap: str,
    outbox_settings: OutboxSettings,
    producer: OutboxProducer,
    session_factory: sessionmaker,
    engine: sa.Engine,
    topics: Topics,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = unique("unknown-offset")
    order_id = f"order-{uuid.uuid4().hex[:10]}"
    offsets_unknown(monkeypatch, 1)
    with producer.transaction(session_factory) as txn:
        assert txn.session is not None
        txn.session.execute(orders.insert().values(id=order_id, amount=1))
        txn.send(topic, f"{order_id}/0", key=order_id)
        txn.send(topic, f"{order_id}/1", key=order_id)

    assert order_id in order_ids(engine)
    named_by_its_commit(topics, txn.txn_id, order_id)
    assert delivered_once(
        kafka_bootstrap, outbox_settings.topic_prefix, topic, txn.txn_id
    ) == values(order_id)


def test_a_send_never_acknowledged_with_an_offset_fails_and_nothing_commits(
    producer: OutboxProducer,
    outbox_settings: OutboxSettings,
    session_factory: sessionmaker,
    engine: sa.Engine,
    topics: Topics,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    order_id = f"order-{uuid.uuid4().hex[:10]}"
    offsets_unknown(monkeypatch, outbox_settings.send_attempts)
    with (
        pytest.raises(HalfSendError, match="acknowledged without an offset"),
        producer.transaction(session_factory) as txn,
    ):
        assert txn.session is not None
        txn.session.execute(orders.insert().values(id=order_id, amount=1))
        txn.send(unique("unknown-offset"), f"{order_id}/0", key=order_id)

    assert order_id not in order_ids(engine)
    assert all(o.state is not OpState.COMMIT for o in topics.ops() if o.txn_id == txn.txn_id)


def test_the_async_form_sends_again_too_and_its_messages_are_delivered_once(
    kafka_bootstrap: str,
    outbox_settings: OutboxSettings,
    producer: OutboxProducer,
    db_url: str,
    engine: sa.Engine,
    topics: Topics,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``async with producer.transaction``: the same report, the same outcome (its sends await
    the acknowledgement through their own path, which shares the offsets' check)."""
    order_id = f"order-{uuid.uuid4().hex[:10]}"
    topic = unique("unknown-offset")
    offsets_unknown(monkeypatch, 1)

    async def main() -> str:
        async with async_factory(db_url) as factory, producer.transaction(factory) as txn:
            assert txn.session is not None
            await txn.session.execute(orders.insert().values(id=order_id, amount=1))
            await txn.send(topic, f"{order_id}/0", key=order_id)
            await txn.send(topic, f"{order_id}/1", key=order_id)
            return txn.txn_id

    txn_id = asyncio.run(main())
    assert order_id in order_ids(engine)
    named_by_its_commit(topics, txn_id, order_id)
    assert delivered_once(kafka_bootstrap, outbox_settings.topic_prefix, topic, txn_id) == values(
        order_id
    )


def test_the_decorator_form_sends_again_and_its_messages_are_delivered_once(
    kafka_bootstrap: str,
    outbox_settings: OutboxSettings,
    producer: OutboxProducer,
    session_factory: sessionmaker,
    engine: sa.Engine,
    topics: Topics,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    order_id = f"order-{uuid.uuid4().hex[:10]}"
    topic = unique("unknown-offset")
    offsets_unknown(monkeypatch, 1)

    @outbox.transactional(producer=producer, session_factory=session_factory)
    def place(*, session: Session) -> str:
        session.execute(orders.insert().values(id=order_id, amount=1))
        outbox.send(topic, f"{order_id}/0", key=order_id)
        outbox.send(topic, f"{order_id}/1", key=order_id)
        return outbox.current_transaction().txn_id

    txn_id = place()
    assert order_id in order_ids(engine)
    named_by_its_commit(topics, txn_id, order_id)
    assert delivered_once(kafka_bootstrap, outbox_settings.topic_prefix, topic, txn_id) == values(
        order_id
    )


def test_the_transactional_producer_sends_again_and_its_messages_are_delivered_once(
    kafka_bootstrap: str,
    outbox_settings: OutboxSettings,
    producer: OutboxProducer,
    engine: sa.Engine,
    topics: Topics,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RocketMQ's form sends the halves before the listener runs: the half send's result, and
    so the COMMIT, names the records sent again."""
    order_id = f"order-{uuid.uuid4().hex[:10]}"
    topic = unique("unknown-offset")
    offsets_unknown(monkeypatch, 1)
    sender = TransactionalProducer(producer, OrdersListener(engine))
    messages = [Message(topic, value, key=order_id) for value in values(order_id)]

    result = sender.send_message_in_transaction(messages, Plan(True, LocalTransactionState.COMMIT))

    assert result.local_transaction_state is LocalTransactionState.COMMIT
    assert order_id in order_ids(engine)
    named_by_its_commit(topics, result.transaction_id, order_id, records=4)
    assert delivered_once(
        kafka_bootstrap, outbox_settings.topic_prefix, topic, result.transaction_id
    ) == values(order_id)


@pytest.mark.parametrize("form", ["TransactionalProducer", "AsyncTransactionalProducer"])
def test_a_listener_transaction_whose_half_send_failed_is_rolled_back_and_its_retry_delivered_once(
    form: str,
    kafka_bootstrap: str,
    outbox_settings: OutboxSettings,
    producer: OutboxProducer,
    engine: sa.Engine,
    topics: Topics,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RocketMQ's form runs no local transaction when its half send fails, but the records may
    be on the half topic (here every attempt was written, its answer without an offset). With no
    op, a check would ask the listener, which answers from the order's row: COMMIT once the
    application's retry of the same order committed, and the order went out twice. The failed
    transaction's own ROLLBACK op settles it first."""
    order_id = f"order-{uuid.uuid4().hex[:10]}"
    listener = OrdersListener(engine)
    producer.serve_checks(engine=engine, secret=SECRET)
    if form == "TransactionalProducer":
        send = TransactionalProducer(producer, listener).send_message_in_transaction
    else:
        sender = AsyncTransactionalProducer(producer, listener)

        def send(message: Message, arg: Plan) -> TransactionSendResult:
            return asyncio.run(sender.send_message_in_transaction(message, arg))

    with pipeline(kafka_bootstrap, topics, check_max=8) as running:
        message = Message(running.topic, order_id, key=order_id)
        # Given an order whose half send failed after its records reached the half topic
        with monkeypatch.context() as patch:
            offsets_unknown(patch, outbox_settings.send_attempts)
            with pytest.raises(HalfSendError, match="acknowledged without an offset"):
                send(message, Plan(True, LocalTransactionState.COMMIT))
        [failed] = {h.txn_id for h in topics.halves() if h.message.value == order_id.encode()}
        assert order_id not in order_ids(engine)  # its local transaction never ran
        # When the application retries the order, and the retry commits
        retried = send(message, Plan(True, LocalTransactionState.COMMIT)).transaction_id
        # Then the failed transaction's own op rolled it back, no check asked the listener
        # about it, and a read_committed reader gets the order once, beside its one row
        assert running.decided([failed, retried]) == {failed: "ROLLBACK", retried: "COMMIT"}
        running.agree(order_ids(engine), [order_id], [])
        assert failed not in {view.transaction_id for view in listener.checked}

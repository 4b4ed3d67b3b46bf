"""A message at the size limit: the whole half record, as librdkafka counts it.

``max_message_bytes`` (1 MiB by default) checks the value alone, but librdkafka refuses a
record whose key, value and headers pass its ``message.max.bytes`` (1,000,000 by default), and
the half record adds the transaction id and the outbox's headers. A value between the two
passed the producer's check and failed at the send as a ``HalfSendError`` that broke the
transaction: code that caught it could not commit what it had done instead. Such a send is now
refused before anything of it leaves (``MessageTooLargeError``, as for a value over
``max_message_bytes``), and a record at the limit is sent, promoted and delivered.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import sessionmaker

from outbox import (
    Message,
    MessageTooLargeError,
    OutboxProducer,
    OutboxSettings,
    TransactionalProducer,
)
from outbox.protocol.half import HalfMessage
from outbox.protocol.headers import HALF_SCHEMA_VERSIONS
from outbox.protocol.record_size import (
    OUTBOX_PART_BYTES,
    half_record_bytes,
    refuse_oversized,
    user_part_bytes,
)
from outbox.protocol.states import CheckBy
from tests.checker.test_checker import SECRET, wait_for
from tests.kafka_helpers import unique
from tests.outbox.test_asyncio import async_factory
from tests.outbox.test_listener_checks import OrdersListener, Plan, State
from tests.pipeline import ops_lost, pipeline
from tests.producer_fixtures import Topics, order_ids, orders
from tests.relay.test_relay import read_topic


@pytest.mark.parametrize("schema_version", HALF_SCHEMA_VERSIONS)
@pytest.mark.parametrize("check_by", list(CheckBy))
def test_the_room_left_for_the_outbox_covers_its_largest_part(
    schema_version: int, check_by: CheckBy
) -> None:
    """The quick check may skip the exact count only when the outbox's part fits its room."""
    group, topic = "g" * 249, "t" * 249
    message = HalfMessage(topic, b"v" * 10, b"k" * 10, (("h", b"x"), ("trace", b"y" * 55)))
    size = half_record_bytes(
        message, producer_group=group, schema_version=schema_version, check_by=check_by
    )
    outbox_part = size - user_part_bytes(message) - len(group) - len(topic)
    assert 0 < outbox_part <= OUTBOX_PART_BYTES
    # a record at the bound passes, one byte more is refused, whichever way it was reached
    kwargs = {"producer_group": group, "schema_version": schema_version, "check_by": check_by}
    refuse_oversized([message], limit=size, **kwargs)
    with pytest.raises(MessageTooLargeError, match=f"up to {size} bytes.*of {size - 1}"):
        refuse_oversized([message], limit=size - 1, **kwargs)


def test_the_default_record_bound_is_librdkafkas() -> None:
    settings = OutboxSettings(bootstrap_servers="localhost:9092", producer_group="orders")
    assert settings.max_record_bytes == 1_000_000
    assert settings.max_message_bytes > settings.max_record_bytes  # hence this check
    raised = OutboxSettings(
        bootstrap_servers="b:9092", producer_group="g", kafka={"message.max.bytes": "2000000"}
    )
    assert raised.max_record_bytes == 2_000_000


def _value_at_the_limit(
    settings: OutboxSettings, topic: str, key: str, check_by: CheckBy = CheckBy.EVIDENCE
) -> int:
    """The longest value whose half record fits librdkafka's message.max.bytes."""
    empty = HalfMessage(topic, b"", key.encode(), ())
    room = half_record_bytes(
        empty,
        producer_group=settings.producer_group,
        schema_version=settings.half_schema_version,
        check_by=check_by,
    )
    return settings.max_record_bytes - room


@pytest.mark.integration
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_record_at_the_limit_is_delivered_and_one_past_it_is_refused_before_it_sends(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    session_factory: sessionmaker,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
) -> None:
    producer.serve_checks(engine=engine, secret=SECRET)
    with pipeline(kafka_bootstrap, topics) as running:
        topic = running.topic
        at, past, in_asyncio = (unique(n) for n in ("at", "past", "async"))
        most = _value_at_the_limit(producer.settings, topic, at)
        assert 990_000 < most < producer.settings.max_message_bytes

        # Given a message whose half record is as large as librdkafka takes: it commits
        with producer.transaction(session_factory) as txn:
            assert txn.session is not None
            txn.session.execute(orders.insert().values(id=at, amount=1))
            txn.send(topic, b"a" * most, key=at)

        # and one a byte larger: refused at its send, before anything of it leaves, so the
        # code that catches it sends something else and commits (before: a HalfSendError that
        # broke the transaction)
        with producer.transaction(session_factory) as txn:
            assert txn.session is not None
            txn.session.execute(orders.insert().values(id=past, amount=1))
            for size in (1_000_000, most + 1):  # what librdkafka refuses; the bound's next
                with pytest.raises(MessageTooLargeError, match=r"message\.max\.bytes of 1000000"):
                    txn.send(topic, b"p" * size, key=past)
            txn.send(topic, b"a reference to the document instead", key=past)
        halves = [h for h in topics.halves() if h.txn_id == txn.txn_id]
        assert [h.message.value for h in halves] == [b"a reference to the document instead"]

        # and the asyncio form: refused when awaited, the transaction goes on
        async def main() -> None:
            async with async_factory(db_url) as factory, producer.transaction(factory) as atxn:
                assert atxn.session is not None
                await atxn.session.execute(orders.insert().values(id=in_asyncio, amount=1))
                with pytest.raises(MessageTooLargeError):
                    await atxn.send(topic, b"q" * (most + 1), key=in_asyncio)
                await atxn.send(topic, b"small", key=in_asyncio)

        asyncio.run(main())

        # Then the rows and a read_committed read of the topic agree: each order once, the
        # record at the limit whole
        assert {at, past, in_asyncio} <= set(order_ids(engine))

        def delivered() -> Counter[str]:
            return Counter(m.key().decode() for m in read_topic(kafka_bootstrap, topic))

        wait_for(lambda: set(delivered()) >= {at, past, in_asyncio})
        time.sleep(2)  # a duplicate would show up by then
        assert delivered() == {at: 1, past: 1, in_asyncio: 1}
        [big] = [m for m in read_topic(kafka_bootstrap, topic) if m.key() == at.encode()]
        assert big.value() == b"a" * most


@pytest.mark.integration
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_listener_transaction_at_the_limit_is_checked_with_its_value_read_back(
    kafka_bootstrap: str,
    db_url: str,
    producer: OutboxProducer,
    engine: sa.Engine,
    topics: Topics,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RocketMQ's form with a message at the limit and its op lost: the check request cannot
    carry the value (base64 in JSON, it is over the request's 1 MiB; the checker leaves it
    out), so the endpoint reads it back from the half
    topic and the listener decides on the whole message."""
    listener = OrdersListener(engine)
    sender = TransactionalProducer(producer, listener, answer_timeout_s=1)
    producer.serve_checks(engine=engine, secret=SECRET)
    order_id = unique("listener-at")
    with pipeline(kafka_bootstrap, topics) as running:
        most = _value_at_the_limit(producer.settings, running.topic, order_id, CheckBy.LISTENER)
        with ops_lost(producer, monkeypatch):
            result = sender.send_message_in_transaction(
                Message(running.topic, b"L" * most, key=order_id), arg=Plan(True, State.COMMIT)
            )
        assert running.decided([result.transaction_id]) == {result.transaction_id: "COMMIT"}
        wait_for(
            lambda: any(
                m.key() == order_id.encode() for m in read_topic(kafka_bootstrap, running.topic)
            )
        )
        time.sleep(2)  # a duplicate would show up by then
        delivered = [m for m in read_topic(kafka_bootstrap, running.topic)]
        assert [(m.key(), m.value()) for m in delivered] == [(order_id.encode(), b"L" * most)]
    assert order_id in order_ids(engine)
    [view] = [v for v in listener.checked if v.transaction_id == result.transaction_id][:1]
    assert view.value == b"L" * most

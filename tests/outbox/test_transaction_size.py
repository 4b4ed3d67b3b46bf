"""The most messages one transaction may send: as many as its op record can name.

An op names each half record of its transaction by offset, and it is one Kafka record. A
transaction with more messages than fit committed its rows, and its op - the producer's, then
every one the checker tried - was refused as too large (``MSG_SIZE_TOO_LARGE``), so its messages
were never delivered. The send that would pass the bound is refused now, before any of it is
sent (``TransactionTooLargeError``); left to propagate, the transaction rolls back, and its
ROLLBACK op, naming what was sent before, fits.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import sessionmaker

from outbox import Message, OutboxProducer, OutboxSettings, TransactionTooLargeError
from outbox.protocol.ids import new_transaction_id
from outbox.protocol.op import OpRecord, encode_op, max_half_offsets
from outbox.protocol.states import DecidedBy, OpState
from tests.checker.test_checker import SECRET
from tests.kafka_helpers import unique
from tests.outbox.test_asyncio import async_factory
from tests.pipeline import pipeline
from tests.producer_fixtures import Topics, order_ids, orders

#: A record framing allowance well above Kafka's (a record batch's header is 61 bytes).
FRAMING = 512


@pytest.mark.parametrize("op_bytes", [100_000, 1_000_000, 1_048_588])
def test_an_op_naming_the_most_offsets_at_their_longest_fits(op_bytes: int) -> None:
    most = max_half_offsets(op_bytes)
    op = OpRecord(
        txn_id=new_transaction_id(),
        state=OpState.GIVEN_UP,
        producer_group="g" * 249,
        half_partition=2**31 - 1,
        half_offsets=(2**63 - 1,) * most,
        decided_by=DecidedBy.CHECKER,
        decided_at_ms=2**63 - 1,
        reason="r" * 2000,
    )
    key, value = encode_op(op)
    assert len(key) + len(value) + FRAMING <= op_bytes
    # and the bound is not far below what fits: one offset more of this op would not
    assert op_bytes - (len(key) + len(value)) < 8192


def test_the_default_bound() -> None:
    settings = OutboxSettings(bootstrap_servers="localhost:9092", producer_group="orders")
    assert settings.max_messages_per_transaction == 49_590
    smaller = dataclasses.replace(settings, kafka={"message.max.bytes": 100_000})
    assert smaller.max_messages_per_transaction == 4_590


@pytest.mark.integration
@pytest.mark.scale  # a bound pushed: 9,000 half records; make test keeps the bound's unit tests
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_transaction_at_the_bound_delivers_and_one_past_it_is_refused_before_it_sends(
    kafka_bootstrap: str,
    outbox_settings: OutboxSettings,
    session_factory: sessionmaker,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
) -> None:
    settings = dataclasses.replace(outbox_settings, kafka={"message.max.bytes": 100_000})
    most = settings.max_messages_per_transaction  # 4,590
    committed: list[str] = []
    refused: list[str] = []

    def messages(topic: str, prefix: str, n: int) -> list[Message]:
        return [Message(topic, f"{prefix}-{i}", key=prefix) for i in range(n)]

    with OutboxProducer(settings) as producer, pipeline(kafka_bootstrap, topics) as running:
        producer.serve_checks(engine=engine, secret=SECRET)
        topic = running.topic

        # Given a transaction of exactly the most messages, in two sends: it commits
        order = unique("most")
        with producer.transaction(session_factory) as txn:
            assert txn.session is not None
            txn.session.execute(orders.insert().values(id=order, amount=1))
            txn.send_batch(messages(topic, order, 3_000))
            txn.send_batch(messages(topic, f"{order}-b", most - 3_000))
        committed += [order, *(f"{order}-{i}" for i in range(3_000))]  # the row, the messages
        committed += [f"{order}-b-{i}" for i in range(most - 3_000)]

        # and one more message than that: the send that passes the bound is refused, nothing
        # of it sent, and the transaction rolls back with what it had sent
        order = unique("past")
        with (
            pytest.raises(TransactionTooLargeError, match=rf"{most + 1} messages.*at most {most}"),
            producer.transaction(session_factory) as txn,
        ):
            assert txn.session is not None
            txn.session.execute(orders.insert().values(id=order, amount=1))
            txn.send_batch(messages(topic, order, 3_000))
            txn.send_batch(messages(topic, f"{order}-b", most - 3_000 + 1))
        refused += [order, *(f"{order}-{i}" for i in range(3_000))]
        refused += [f"{order}-b-{i}" for i in range(most - 3_000 + 1)]
        assert len([h for h in topics.halves() if h.txn_id == txn.txn_id]) == 3_000

        # and the asyncio form, one send past the bound: refused, nothing sent
        async def in_asyncio() -> str:
            async with async_factory(db_url) as factory:
                with pytest.raises(TransactionTooLargeError):
                    async with producer.transaction(factory) as atxn:
                        await atxn.send_batch(messages(topic, "async-past", most + 1))
                return atxn.txn_id

        async_txn = asyncio.run(in_asyncio())
        assert not [h for h in topics.halves() if h.txn_id == async_txn]
        refused += [f"async-past-{i}" for i in range(most + 1)]

        # Then the rows and the topic agree: the first order and each of its messages once, the
        # others neither
        rows = set(order_ids(engine))
        assert committed[0] in rows
        assert not {refused[0]} & rows
        delivered = running.settle(lambda: set(committed[1:]))
        assert {m: delivered[m] for m in committed[1:]} == dict.fromkeys(committed[1:], 1)
        assert not set(refused) & set(delivered)

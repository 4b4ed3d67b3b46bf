"""``OutboxProducer.close()`` closes every part, whatever one of them raised."""

from __future__ import annotations

import dataclasses
import socket
import uuid
from typing import Any
from urllib.parse import urlsplit

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import sessionmaker

import outbox
from outbox import OutboxProducer, OutboxSettings
from outbox.protocol.states import OpState
from outbox.registry import Heartbeat
from tests.producer_fixtures import Topics, evidence_ids, order_ids, orders

pytestmark = pytest.mark.integration


def _serving(url: str) -> bool:
    where = urlsplit(url)
    try:
        socket.create_connection((where.hostname, where.port), timeout=2).close()
    except ConnectionRefusedError:
        return False
    return True


def test_a_part_that_fails_to_close_leaves_the_rest_closed_and_the_ops_sent(
    outbox_settings: OutboxSettings,
    engine: sa.Engine,
    session_factory: sessionmaker,
    topics: Topics,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    # the op one-way, as by default: close() is what flushes it
    settings = dataclasses.replace(outbox_settings, wait_for_op=False)
    producer = OutboxProducer(settings)
    request.addfinalizer(producer.close)  # a second close() does nothing
    real_close = Heartbeat.close

    def close_then_fail(self: Heartbeat) -> None:
        real_close(self)
        raise RuntimeError("the heartbeat's close failed")

    monkeypatch.setattr(Heartbeat, "close", close_then_fail)
    server = producer.serve_checks(engine=engine, insecure_local=True, host="127.0.0.1", port=0)
    order_id = f"order-{uuid.uuid4().hex[:12]}"

    @outbox.transactional(producer=producer, session_factory=session_factory)
    def place(*, session: Any) -> None:
        outbox.send("orders", b"placed", key=order_id)
        session.execute(orders.insert().values(id=order_id, amount=1))

    place()
    assert _serving(server.url)

    with pytest.raises(RuntimeError, match="heartbeat's close failed"):
        producer.close()

    # the parts after the heartbeat were closed all the same
    assert not _serving(server.url)
    with (
        pytest.raises(outbox.ProducerClosedError, match="closed"),
        producer.transaction(session_factory) as txn,
    ):
        txn.send("orders", b"after close")
    # and the committed transaction's op left with the flush (the topics are this test's own;
    # the database is shared with other tests)
    [half] = topics.halves()
    assert [(op.txn_id, op.state) for op in topics.ops()] == [(half.txn_id, OpState.COMMIT)]
    assert evidence_ids(engine).get(half.txn_id) == "evidence"
    assert order_id in order_ids(engine)

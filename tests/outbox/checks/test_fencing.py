"""Fenced resolution never answers ROLLBACK for a transaction that can still commit."""

from __future__ import annotations

import threading
import uuid

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

import outbox
from outbox import OutboxProducer
from outbox.checks.resolver import FencedResolver
from outbox.protocol import LocalTransactionState, OpState
from outbox.protocol.check import CheckedTransaction
from tests.producer_fixtures import Topics, order_ids, orders

pytestmark = pytest.mark.integration
State = LocalTransactionState


def asked(txn_ids: list[str]) -> list[CheckedTransaction]:
    return [CheckedTransaction(t) for t in txn_ids]


def test_a_transaction_still_running_is_unknown_and_commits_afterwards(
    producer: OutboxProducer, session_factory: sessionmaker, engine: sa.Engine, topics: Topics
) -> None:
    resolver = FencedResolver(engine, "orders", lock_timeout_s=1)
    order_id = f"order-{uuid.uuid4().hex[:10]}"
    sent, checked = threading.Event(), threading.Event()
    txn_ids: list[str] = []

    @outbox.transactional(producer=producer, session_factory=session_factory)
    def slow(*, session: Session) -> None:
        outbox.send("orders", b"slow", key=order_id)  # evidence row written, not committed
        txn_ids.append(outbox.current_transaction().txn_id)
        session.execute(orders.insert().values(id=order_id, amount=1))
        sent.set()
        assert checked.wait(30)

    worker = threading.Thread(target=slow)
    worker.start()
    assert sent.wait(30)
    # When it is checked while it still holds its evidence row
    during = resolver.resolve(asked(txn_ids))
    checked.set()
    worker.join(30)
    # Then the check said UNKNOWN (not a guess), and the transaction committed normally
    assert during == {txn_ids[0]: State.UNKNOWN}
    assert resolver.resolve(asked(txn_ids)) == {txn_ids[0]: State.COMMIT}
    assert order_id in order_ids(engine)
    assert [o.state for o in topics.ops()] == [OpState.COMMIT]


def test_a_fenced_transaction_fails_on_commit_and_is_never_delivered(
    producer: OutboxProducer, session_factory: sessionmaker, engine: sa.Engine, topics: Topics
) -> None:
    resolver = FencedResolver(engine, "orders", lock_timeout_s=1)
    order_id = f"order-{uuid.uuid4().hex[:10]}"
    answers: list[dict[str, State]] = []

    @outbox.transactional(producer=producer, session_factory=session_factory)
    def late(*, session: Session) -> None:
        # The check comes before this transaction wrote anything (on SQLite any write would
        # hold the database lock and make the check UNKNOWN): it fences the id
        answers.append(resolver.resolve(asked([outbox.current_transaction().txn_id])))
        outbox.send("orders", b"late", key=order_id)
        session.execute(orders.insert().values(id=order_id, amount=1))

    with pytest.raises(outbox.TransactionFencedError):
        late()
    [answer] = answers
    assert list(answer.values()) == [State.ROLLBACK]
    assert order_id not in order_ids(engine)
    assert [o.state for o in topics.ops()] == [OpState.ROLLBACK]

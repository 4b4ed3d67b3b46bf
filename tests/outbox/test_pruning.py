"""Pruning the evidence table: old rows go, and a check arriving afterwards never answers a
wrong ROLLBACK (docs/checks.md, "Pruning the evidence table")."""

from __future__ import annotations

import datetime as dt
import os
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

import outbox
from outbox import ConfigurationError, OutboxProducer, prune_evidence
from outbox.checks.resolver import FencedResolver
from outbox.evidence import EVIDENCE, FENCE, evidence_table, horizon_table
from outbox.protocol import LocalTransactionState, OpState
from outbox.protocol.check import CheckedTransaction
from outbox.pruning import pruned_before_ms
from tests.checker.test_checker import SECRET
from tests.kafka_helpers import unique
from tests.pipeline import ops_lost, pipeline
from tests.producer_fixtures import Topics, evidence_ids, order_ids, orders

pytestmark = pytest.mark.integration
State = LocalTransactionState
NOW = dt.datetime.now(dt.UTC)


@pytest.fixture(autouse=True)
def horizon_reset(engine: sa.Engine) -> Iterator[None]:
    """The databases are shared by the session's tests: a horizon left behind (some tests
    prune as of days from now) would make every later check answer UNKNOWN."""
    yield
    with engine.begin() as conn:
        conn.execute(horizon_table.delete())


def txn_id_at(when: dt.datetime) -> str:
    """A transaction id (UUIDv7) as a producer creates it at ``when``."""
    millis = int(when.timestamp() * 1000)
    rand = int.from_bytes(os.urandom(10), "big")
    value = (millis << 80) | (0x7 << 76) | (((rand >> 62) & 0xFFF) << 64) | (0b10 << 62)
    return str(uuid.UUID(int=value | (rand & ((1 << 62) - 1))))


def committed_at(engine: sa.Engine, when: dt.datetime, kind: str = EVIDENCE) -> str:
    """A transaction that wrote its row at ``when`` (the producer's clock, as its id)."""
    txn_id = txn_id_at(when - dt.timedelta(milliseconds=5))
    row = {"txn_id": txn_id, "kind": kind, "producer_group": "orders", "created_at": when}
    with engine.begin() as conn:
        conn.execute(evidence_table.insert(), [row])
    return txn_id


def test_prune_deletes_rows_older_than_the_retention_records_the_horizon_and_keeps_the_rest(
    engine: sa.Engine,
) -> None:
    old = [committed_at(engine, NOW - dt.timedelta(days=d)) for d in (3, 30)]
    fenced = committed_at(engine, NOW - dt.timedelta(days=2), FENCE)
    young = [committed_at(engine, NOW - dt.timedelta(hours=h)) for h in (1, 23)]

    done = prune_evidence(engine, older_than=dt.timedelta(days=1), batch_size=1, now=NOW)

    rows = evidence_ids(engine)
    assert not set(rows) & {*old, fenced}
    assert set(young) <= set(rows)
    assert done.deleted >= 3 and done.pruned_before == NOW - dt.timedelta(days=1)
    with engine.connect() as conn:
        horizon = pruned_before_ms(conn)
    assert horizon == int((NOW - dt.timedelta(days=1)).timestamp() * 1000)
    # Again with a longer retention: nothing more goes, and the horizon does not move back
    again = prune_evidence(engine, older_than=dt.timedelta(days=7), now=NOW)
    assert again.deleted == 0
    with engine.connect() as conn:
        assert pruned_before_ms(conn) == horizon


def test_prune_refuses_a_retention_shorter_than_a_day(engine: sa.Engine) -> None:
    with pytest.raises(ConfigurationError, match="shorter than 1 day"):
        prune_evidence(engine, older_than=dt.timedelta(hours=23))


def test_prune_of_a_hundred_thousand_rows_keeps_exactly_the_young_ones(engine: sa.Engine) -> None:
    old = NOW - dt.timedelta(days=20)
    rows = [
        {"txn_id": txn_id_at(old), "kind": EVIDENCE, "producer_group": "bulk", "created_at": old}
        for _ in range(100_000)
    ]
    young = [committed_at(engine, NOW - dt.timedelta(minutes=m)) for m in range(1, 51)]
    with engine.begin() as conn:
        conn.execute(evidence_table.insert(), rows)

    done = prune_evidence(engine, older_than=dt.timedelta(days=14), now=NOW)

    assert done.deleted >= 100_000
    with engine.connect() as conn:
        left = conn.execute(
            sa.select(sa.func.count())
            .select_from(evidence_table)
            .where(evidence_table.c.producer_group == "bulk")
        ).scalar()
    assert left == 0 and set(young) <= set(evidence_ids(engine))


def test_a_check_after_pruning_answers_unknown_for_old_transactions_and_still_fences_new_ones(
    engine: sa.Engine,
) -> None:
    pruned = committed_at(engine, NOW - dt.timedelta(days=3))
    kept = committed_at(engine, NOW - dt.timedelta(hours=2))
    prune_evidence(engine, older_than=dt.timedelta(days=1), now=NOW)
    never_wrote = txn_id_at(NOW - dt.timedelta(days=5))  # a producer died before its row
    fresh = txn_id_at(dt.datetime.now(dt.UTC))  # still running, or died: no row yet

    resolver = FencedResolver(engine, "orders", lock_timeout_s=1)
    ids = [pruned, kept, never_wrote, fresh]
    answers = resolver.resolve([CheckedTransaction(t) for t in ids])

    assert answers == {
        pruned: State.UNKNOWN,  # its row may be one of those pruned: never fenced
        kept: State.COMMIT,
        never_wrote: State.UNKNOWN,
        fresh: State.ROLLBACK,  # younger than the horizon: fenced as before
    }
    assert evidence_ids(engine)[fresh] == FENCE and pruned not in evidence_ids(engine)


def test_a_committed_transaction_whose_row_was_pruned_before_its_check_is_given_up_not_rolled_back(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    session_factory: sessionmaker,
    engine: sa.Engine,
    topics: Topics,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a transaction that committed, its op lost, checked only after its row was pruned
    # (the checker down longer than the retention: pruning as of two days from now)
    producer.serve_checks(engine=engine, secret=SECRET)
    order_id = f"order-{uuid.uuid4().hex[:8]}"

    @outbox.transactional(producer=producer, session_factory=session_factory)
    def place(topic: str, *, session: Session) -> str:
        outbox.send(topic, order_id, key=order_id)
        session.execute(orders.insert().values(id=order_id, amount=1))
        return outbox.current_transaction().txn_id

    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=2)
    with ops_lost(producer, monkeypatch):
        txn_id = place(unique("orders"))
    assert prune_evidence(engine, older_than=dt.timedelta(days=1), now=later).deleted >= 1
    assert txn_id not in evidence_ids(engine)
    # When the checker checks it
    with pipeline(kafka_bootstrap, topics, check_max=2) as running:
        decided = running.decided([txn_id])
    # Then it is given up for an operator (UNKNOWN answers), never fenced into a ROLLBACK
    assert decided == {txn_id: OpState.GIVEN_UP.value}
    assert order_id in order_ids(engine) and txn_id not in evidence_ids(engine)

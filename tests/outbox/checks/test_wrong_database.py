"""A check endpoint given another database than the transactions commit to never fences there.

A wrong DSN (the staging database, a copy, one shard of several a producer group writes to)
holds no evidence row for a transaction that committed: a fence there would answer ROLLBACK, and
the committed transaction's messages would never be delivered. The resolver sees that the
evidence rows of the producer's latest COMMITs are missing from its database, answers UNKNOWN
and says why; once the endpoint is given the right engine, the checker's next ask commits it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session, sessionmaker

import outbox
from outbox import OutboxProducer, OutboxSettings, migrations
from outbox.checks.async_resolver import AsyncFencedResolver
from outbox.checks.resolver import FencedResolver
from outbox.protocol import LocalTransactionState, new_transaction_id
from outbox.protocol.check import CheckedTransaction
from tests.checker.test_checker import SECRET
from tests.pipeline import ops_lost, pipeline
from tests.producer_fixtures import Topics, evidence_ids, order_ids, orders, orders_metadata

pytestmark = pytest.mark.integration
State = LocalTransactionState


@pytest.fixture
def other_url(db_url: str, tmp_path: Path) -> Iterator[str]:
    """Another migrated database of the same kind as ``db_url``'s, with the orders table."""
    admin: sa.Engine | None = None
    if db_url.startswith("sqlite"):
        url = f"sqlite:///{tmp_path / 'other.db'}"
    else:
        admin = sa.create_engine(db_url, isolation_level="AUTOCOMMIT")
        name = f"other_{uuid.uuid4().hex[:8]}"
        with admin.connect() as conn:
            conn.execute(sa.text(f"CREATE DATABASE {name}"))
        url = admin.url.set(database=name).render_as_string(hide_password=False)
    migrations.upgrade(url)
    setup = sa.create_engine(url)
    orders_metadata.create_all(setup)
    setup.dispose()
    yield url
    if admin is not None:
        with admin.connect() as conn:
            conn.execute(sa.text(f"DROP DATABASE {name} WITH (FORCE)"))
        admin.dispose()


def place(producer: OutboxProducer, engine: sa.Engine, topic: str) -> tuple[str, str]:
    """One order row and its message (the context manager); (order id, transaction id)."""
    order_id = f"order-{uuid.uuid4().hex[:10]}"
    with producer.transaction(sessionmaker(engine)) as txn:
        assert txn.session is not None
        txn.session.execute(orders.insert().values(id=order_id, amount=1))
        txn.send(topic, order_id, key=order_id)
    return order_id, txn.txn_id


def place_decorated(producer: OutboxProducer, engine: sa.Engine, topic: str) -> tuple[str, str]:
    order_id = f"order-{uuid.uuid4().hex[:10]}"

    @outbox.transactional(producer=producer, session_factory=sessionmaker(engine))
    def order(*, session: Session) -> str:
        session.execute(orders.insert().values(id=order_id, amount=1))
        outbox.send(topic, order_id, key=order_id)
        return outbox.current_transaction().txn_id

    return order_id, order()


def place_async(producer: OutboxProducer, engine: sa.Engine, topic: str) -> tuple[str, str]:
    order_id = f"order-{uuid.uuid4().hex[:10]}"
    url = engine.url.set(drivername="sqlite+aiosqlite")

    async def order() -> str:
        async_engine = create_async_engine(url)
        try:
            async with AsyncSession(async_engine) as session:
                async with producer.transaction(session) as txn:
                    await session.execute(orders.insert().values(id=order_id, amount=1))
                    await txn.send(topic, order_id, key=order_id)
                return txn.txn_id
        finally:
            await async_engine.dispose()

    return order_id, asyncio.run(order())


#: The forms a user commits with; the decorator and asyncio ones on SQLite only (the same
#: resolver answers; make test's time is short).
FORMS = [
    pytest.param("with", place, id="with"),
    pytest.param("decorator", place_decorated, id="decorator"),
    pytest.param("async with", place_async, id="async-with"),
]


@pytest.mark.parametrize(("form", "commit"), FORMS)
def test_a_committed_transaction_checked_in_another_database_is_not_fenced_and_commits_later(
    form: str,
    commit: Callable[[OutboxProducer, sa.Engine, str], tuple[str, str]],
    db_url: str,
    kafka_bootstrap: str,
    outbox_settings: OutboxSettings,
    producer: OutboxProducer,
    engine: sa.Engine,
    other_url: str,
    topics: Topics,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if form != "with" and not db_url.startswith("sqlite"):
        pytest.skip("the decorator and asyncio forms are walked on SQLite")
    wrong = sa.create_engine(other_url)
    # Given a check endpoint started with the wrong database's engine
    producer.serve_checks(engine=wrong, secret=SECRET)
    with pipeline(kafka_bootstrap, topics) as running, caplog.at_level(logging.ERROR):
        # and a transaction that commits in the right one, its op lost
        with ops_lost(producer, monkeypatch):
            order_id, txn_id = commit(producer, engine, running.topic)
        # When the checker asks the endpoint about it
        deadline = time.monotonic() + 60
        refusals: list[str] = []
        while not refusals and not topics.ops():
            assert time.monotonic() < deadline, "the checker never asked"
            time.sleep(0.5)
            refusals = [r.getMessage() for r in caplog.records if "not fencing" in r.getMessage()]
        # Then it was not fenced in the wrong database nor decided: nothing is lost yet
        assert [(o.txn_id, o.state.value) for o in topics.ops()] == []
        assert txn_id not in evidence_ids(wrong)
        refusal = refusals[0]
        assert running.delivered()[order_id] == 0
        # and the error names both databases, the transaction and the fix
        assert other_url.rsplit("/", 1)[-1] in refusal
        assert str(engine.url.database) in refusal
        assert txn_id in refusal and "engine of the database the transactions write to" in refusal
        # When the service restarts with the right engine
        producer.close()
        with OutboxProducer(outbox_settings) as fixed:
            fixed.serve_checks(engine=engine, secret=SECRET)
            # Then the checker's next ask commits it, and it is delivered once
            assert running.decided([txn_id]) == {txn_id: "COMMIT"}
            running.agree(order_ids(engine), [order_id], [])
    assert evidence_ids(engine)[txn_id] == "evidence"
    assert txn_id not in evidence_ids(wrong)
    wrong.dispose()


def test_a_producer_group_committing_to_two_databases_fences_in_neither(
    producer: OutboxProducer, engine: sa.Engine, other_url: str
) -> None:
    other = sa.create_engine(other_url)
    resolver = FencedResolver(engine, "orders", lock_timeout_s=1, witnesses=producer.witnesses)
    never = new_transaction_id()
    # Given transactions of the group in its own database only: a fence is the truth there
    place(producer, engine, "orders")
    assert resolver.resolve([CheckedTransaction(never)]) == {never: State.ROLLBACK}
    assert evidence_ids(engine)[never] == "fence"
    # When the group also commits in another database
    place(producer, other, "orders")
    unknown = new_transaction_id()
    # Then neither database fences: the transaction may have committed in the other
    assert resolver.resolve([CheckedTransaction(unknown)]) == {unknown: State.UNKNOWN}
    assert unknown not in evidence_ids(engine)
    in_other = FencedResolver(other, "orders", lock_timeout_s=1, witnesses=producer.witnesses)
    assert in_other.resolve([CheckedTransaction(unknown)]) == {unknown: State.UNKNOWN}
    assert unknown not in evidence_ids(other)
    # and answers from the evidence rows it has are still given
    assert resolver.resolve([CheckedTransaction(never)]) == {never: State.ROLLBACK}
    other.dispose()


def test_the_asyncio_form_witnesses_its_commits_for_the_async_resolver(
    producer: OutboxProducer, db_url: str, engine: sa.Engine, other_url: str
) -> None:
    if not db_url.startswith("sqlite"):
        pytest.skip("aiosqlite is the asyncio driver the suite has for both databases' files")
    right = create_async_engine(db_url.replace("sqlite://", "sqlite+aiosqlite://", 1))
    wrong = create_async_engine(other_url.replace("sqlite://", "sqlite+aiosqlite://", 1))
    unknown = new_transaction_id()

    async def scenario() -> tuple[dict[str, State], dict[str, State]]:
        async with producer.transaction(AsyncSession(right)) as txn:
            await txn.send("orders", b"x", key=b"x")
        in_wrong = AsyncFencedResolver(wrong, "orders", witnesses=producer.witnesses)
        in_right = AsyncFencedResolver(right, "orders", witnesses=producer.witnesses)
        asked = [CheckedTransaction(unknown)]
        return await in_wrong.resolve(asked), await in_right.resolve(asked)

    # Given an asyncio transaction committed in the right database: the wrong one does not
    # fence, the right one does
    assert asyncio.run(scenario()) == ({unknown: State.UNKNOWN}, {unknown: State.ROLLBACK})
    assert evidence_ids(engine)[unknown] == "fence"
    assert unknown not in evidence_ids(sa.create_engine(other_url))

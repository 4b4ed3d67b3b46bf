"""A session that does not give the outbox a database transaction of its own, which its
COMMIT commits, is refused before the caller's code runs (:mod:`outbox.database_transaction`).

- **Autocommit** (``create_engine(url, isolation_level="AUTOCOMMIT")``, an engine's
  ``execution_options``, SQLite's driver with ``isolation_level=None``): each statement commits
  as it runs, so a write before the code raises stays, and the evidence row with it makes a
  check answer COMMIT for a transaction that declined.
- **A transaction someone else owns** (a session bound to a ``Connection`` already in a
  transaction, the usual test-suite fixture): the session's commit leaves that transaction to
  its owner, who may roll it back after the COMMIT op was written.

Each scenario ends where a user looks: the order rows in the database and what a
``read_committed`` consumer of the real topic receives, with the op records lost so a checker
decides whatever was sent. SQLAlchemy's documented SQLite recipe (the driver's own
transactions off, ``BEGIN`` emitted by a ``begin`` event, for working savepoints) and a
session given the connection's transaction (``join_transaction_mode="control_fully"``) are
transactions of the session's own, and must not be refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker

import outbox
from outbox import AutocommitSessionError, ExternalTransactionError, OutboxProducer
from outbox.evidence import evidence_table, horizon_table
from tests.checker.test_checker import SECRET
from tests.outbox.test_asyncio import async_url
from tests.pipeline import ops_lost, pipeline
from tests.producer_fixtures import Topics, order_ids, orders

pytestmark = pytest.mark.integration


class Declined(Exception):
    pass


def _insert(session: Session, order_id: str) -> None:
    session.execute(orders.insert().values(id=order_id, amount=1))


def autocommit_engines(db_url: str, engine: sa.Engine) -> dict[str, sa.Engine]:
    """The ways a user puts an engine's connections in autocommit mode."""
    engines = {
        "create_engine(isolation_level=AUTOCOMMIT)": sa.create_engine(
            db_url, isolation_level="AUTOCOMMIT"
        ),
        "engine.execution_options(isolation_level=AUTOCOMMIT)": engine.execution_options(
            isolation_level="AUTOCOMMIT"
        ),
    }
    if db_url.startswith("sqlite"):  # the driver's own switch: no BEGIN is ever sent
        engines["sqlite3.connect(isolation_level=None)"] = sa.create_engine(
            db_url, connect_args={"isolation_level": None}
        )
    return engines


def sqlite_recipe_engine(db_url: str) -> sa.Engine:
    """SQLAlchemy's recipe for SQLite savepoints: the driver's transactions off, BEGIN
    emitted by SQLAlchemy - a transaction the outbox must accept."""
    engine = sa.create_engine(db_url)

    @event.listens_for(engine, "connect")
    def _no_driver_transactions(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN")

    return engine


def write_send_write_decline(topic: str, ids: list[str]) -> Callable[[Session], None]:
    """A write, a send, a write, then the code declines: nothing may stay of it."""

    def body(session: Session) -> None:
        _insert(session, ids[0])
        outbox.send(topic, ids[0], key=ids[0])
        _insert(session, ids[1])
        raise Declined(ids)

    return body


def send_then_write(topic: str, ids: list[str]) -> Callable[[Session], None]:
    """The README's habit: send first; the first statement is then the evidence INSERT."""

    def body(session: Session) -> None:
        outbox.send(topic, ids[0], key=ids[0])
        _insert(session, ids[0])

    return body


def refusal_caught(topic: str, ids: list[str]) -> Callable[[Session], None]:
    """The refusal caught, and the code carries on as if nothing happened."""

    def body(session: Session) -> None:
        with contextlib.suppress(AutocommitSessionError):
            _insert(session, ids[0])
        with contextlib.suppress(sa.exc.SQLAlchemyError):  # fails: the connection is gone
            _insert(session, ids[1])

    return body


BODIES = {
    "write, send, write, decline": write_send_write_decline,
    "send first": send_then_write,
    "refusal caught": refusal_caught,
}


def run_decorated(producer: OutboxProducer, factory: sessionmaker, body: Callable) -> None:
    @outbox.transactional(producer=producer, session_factory=factory)
    def place(*, session: Session) -> None:
        body(session)

    place()


def run_in_context(producer: OutboxProducer, factory: sessionmaker, body: Callable) -> None:
    with producer.transaction(factory) as txn:
        assert txn.session is not None
        body(txn.session)


@pytest.mark.parametrize("form", [run_decorated, run_in_context], ids=["decorator", "with"])
def test_an_autocommit_session_is_refused_before_the_code_runs(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
    monkeypatch: pytest.MonkeyPatch,
    form: Callable[..., None],
) -> None:
    producer.serve_checks(engine=engine, secret=SECRET)
    with pipeline(kafka_bootstrap, topics) as running:
        refused: dict[str, list[str]] = {}
        raised: dict[str, BaseException | None] = {}
        # Given, on each autocommit engine, a transaction that writes, sends, writes and
        # declines, one that sends first and one that catches the refusal and carries on; their
        # ops lost
        with ops_lost(producer, monkeypatch):
            for engine_name, autocommit in autocommit_engines(db_url, engine).items():
                for body_name, body in BODIES.items():
                    name = f"{engine_name}: {body_name}"
                    ids = [f"auto-{uuid.uuid4().hex[:8]}" for _ in range(2)]
                    refused[name] = ids
                    try:
                        form(producer, sessionmaker(autocommit), body(running.topic, ids))
                        raised[name] = None
                    except Exception as err:
                        raised[name] = err
        # and then a transaction on the ordinary engine, delivered as usual
        control = f"control-{uuid.uuid4().hex[:8]}"
        form(
            producer,
            sessionmaker(engine),
            lambda s: (outbox.send(running.topic, control), _insert(s, control)),
        )
        delivered = running.settle(lambda: {control})
        # Then no row committed and no message delivered
        rows = set(order_ids(engine))
        report = {
            n: (sorted(rows & set(ids)), sorted(set(delivered) & set(ids)))
            for n, ids in refused.items()
        }
        assert report == dict.fromkeys(refused, ([], [])), "(rows in the DB, orders delivered)"
        assert delivered == {control: 1}
        # and each was refused by name
        assert {n: type(e) for n, e in raised.items()} == dict.fromkeys(
            refused, AutocommitSessionError
        )
        assert all("AUTOCOMMIT" in str(e) for e in raised.values()), raised
        # and what the sending-first ones sent was decided ROLLBACK (by the checker: no
        # evidence row); the others sent nothing
        sent = {h.message.value.decode(): h.txn_id for h in topics.halves()}
        first = {ids[0] for n, ids in refused.items() if n.endswith("send first")}
        assert set(sent) == first | {control}
        assert set(running.decided(sent[i] for i in first).values()) <= {"ROLLBACK"}


def test_sqlalchemys_sqlite_savepoint_recipe_is_a_transaction(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not db_url.startswith("sqlite"):
        pytest.skip("a SQLite driver recipe")
    producer.serve_checks(engine=engine, secret=SECRET)
    recipe = sqlite_recipe_engine(db_url)
    with pipeline(kafka_bootstrap, topics) as running:
        declined = [f"declined-{uuid.uuid4().hex[:8]}" for _ in range(2)]
        kept = f"kept-{uuid.uuid4().hex[:8]}"
        # Given the recipe's engine, one transaction that declines and one that commits, with a
        # savepoint rolled back inside it (what the recipe is for), their ops lost
        with ops_lost(producer, monkeypatch):
            with pytest.raises(Declined):
                run_decorated(
                    producer,
                    sessionmaker(recipe),
                    write_send_write_decline(running.topic, declined),
                )

            def keep(session: Session) -> None:
                outbox.send(running.topic, kept, key=kept)
                _insert(session, kept)
                try:
                    with session.begin_nested():
                        _insert(session, kept)  # a duplicate key, rolled back to the savepoint
                except sa.exc.IntegrityError:
                    pass

            run_decorated(producer, sessionmaker(recipe), keep)
        # Then the declined one left nothing, and the kept one is in the DB and delivered once
        delivered = running.settle(lambda: {kept})
        assert set(declined) & set(order_ids(engine)) == set()
        assert kept in order_ids(engine)
        assert delivered == {kept: 1}
    recipe.dispose()


def test_an_autocommit_or_joined_async_session_is_refused_before_the_code_runs(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
) -> None:
    ids = [f"async-auto-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    topic = f"orders-{uuid.uuid4().hex[:8]}"

    async def run() -> None:
        autocommit = create_async_engine(async_url(db_url), isolation_level="AUTOCOMMIT")
        try:
            factory = async_sessionmaker(autocommit)

            @outbox.transactional(producer=producer, session_factory=factory)
            async def place(*, session: AsyncSession) -> None:
                await session.execute(orders.insert().values(id=ids[0], amount=1))
                await outbox.send(topic, ids[0], key=ids[0])
                await session.execute(orders.insert().values(id=ids[1], amount=1))
                raise Declined(ids)

            with pytest.raises(AutocommitSessionError, match="AUTOCOMMIT"):
                await place()
            async with factory() as used:  # the caller's session, begun and used already
                await used.execute(sa.select(1))
                with pytest.raises(AutocommitSessionError, match="AUTOCOMMIT"):
                    await place(session=used)
            with pytest.raises(AutocommitSessionError, match="AUTOCOMMIT"):
                async with producer.transaction(factory) as txn:
                    await outbox.send(topic, ids[0], key=ids[0])
                    assert txn  # never reached
            # and a session joined to a transaction its connection's owner holds
            ordinary = create_async_engine(async_url(db_url))
            try:
                async with ordinary.connect() as connection:
                    await connection.begin()
                    with pytest.raises(ExternalTransactionError, match="control_fully"):
                        await place(session=AsyncSession(bind=connection))
                    await connection.rollback()

                # while a session the caller passes in, already begun, is its own transaction
                @outbox.transactional(producer=producer)
                async def keep(*, session: AsyncSession) -> str:
                    await outbox.send(topic, kept, key=kept)
                    await session.execute(orders.insert().values(id=kept, amount=1))
                    return outbox.current_transaction().txn_id

                async with async_sessionmaker(ordinary)() as begun:
                    await begun.begin()  # a transaction begun, no connection checked out yet
                    kept_txn.append(await keep(session=begun))
            finally:
                await ordinary.dispose()
        finally:
            await autocommit.dispose()

    kept = f"async-kept-{uuid.uuid4().hex[:8]}"
    kept_txn: list[str] = []
    asyncio.run(run())
    # Then nothing was written; the transaction that sent first (its evidence INSERT refused)
    # sent one half message, and its ROLLBACK op drops it; the caller's begun session committed
    assert set(ids) & set(order_ids(engine)) == set()
    assert kept in order_ids(engine)
    states = {op.txn_id: op.state.value for op in topics.ops()}
    assert {h.txn_id for h in topics.halves()} == set(states)
    assert sorted(states.values()) == ["COMMIT", "ROLLBACK"]
    assert states[kept_txn[0]] == "COMMIT"


def test_a_session_joined_to_a_transaction_it_does_not_own_is_refused(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    engine: sa.Engine,
    topics: Topics,
) -> None:
    producer.serve_checks(engine=engine, secret=SECRET)
    with pipeline(kafka_bootstrap, topics) as running:
        fully = f"fully-{uuid.uuid4().hex[:8]}"
        joined: list[str] = []
        raised: dict[str, BaseException | None] = {}
        # Given SQLAlchemy's "join a session into an external transaction" fixture: a
        # connection in a transaction, a session bound to it, the outbox transaction given
        # that session; its owner rolls the connection's transaction back afterwards (the ops
        # are not lost here: the COMMIT op the outbox would write is the harm)
        setups: dict[str, tuple[dict[str, Any], bool, bool]] = {
            # name: (Session options, the connection in a savepoint, the session used before)
            "joined, decorator": ({}, False, False),
            "joined, with": ({}, False, False),
            "joined, used before the call": ({}, False, True),
            "joined with a savepoint": (
                {"join_transaction_mode": "create_savepoint"},
                False,
                False,
            ),
            "joined, binds per table": ({"binds": True}, False, False),
            "control_fully on a connection in a savepoint": (
                {"join_transaction_mode": "control_fully"},
                True,
                False,
            ),
        }
        for name, (options, in_savepoint, used) in setups.items():
            order_id = f"joined-{uuid.uuid4().hex[:8]}"
            joined.append(order_id)
            form = run_in_context_with if name.endswith("with") else run_decorated_with
            with engine.connect() as connection:
                connection.begin()
                if in_savepoint:
                    connection.begin_nested()
                if options.get("binds"):  # no bind of its own: seen as each table's begins
                    tables = {orders: connection, evidence_table: connection}
                    session = Session(binds=tables)  # type: ignore[arg-type]
                else:
                    session = Session(bind=connection, **options)
                if used:
                    session.execute(sa.select(1))  # the fixture seeds or reads first
                try:
                    form(producer, session, writes_and_sends(running.topic, order_id))
                    raised[name] = None
                except Exception as err:
                    raised[name] = err
                session.close()
                connection.rollback()
        # and one given the connection's transaction to commit (control_fully)
        with engine.connect() as connection:
            connection.begin()
            session = Session(bind=connection, join_transaction_mode="control_fully")
            run_decorated_with(producer, session, writes_and_sends(running.topic, fully))
            session.close()
        # Then the joined ones were refused, leaving nothing; the other committed and was
        # delivered once
        delivered = running.settle(lambda: {fully})
        rows = set(order_ids(engine))
        assert (sorted(rows & set(joined)), sorted(set(delivered) & set(joined))) == ([], [])
        assert {n: type(e) for n, e in raised.items()} == dict.fromkeys(
            setups, ExternalTransactionError
        )
        assert fully in rows
        assert delivered == {fully: 1}
        # and only the one with binds per table (seen at its first statement: the evidence
        # INSERT after its send) sent a half message; the others were refused before the code
        binds_per_table = joined[list(setups).index("joined, binds per table")]
        sent = {h.message.value.decode() for h in topics.halves()}
        assert sent & set(joined) == {binds_per_table}


def writes_and_sends(topic: str, order_id: str) -> Callable[[Session], None]:
    def body(session: Session) -> None:
        outbox.send(topic, order_id, key=order_id)
        _insert(session, order_id)

    return body


def run_decorated_with(producer: OutboxProducer, session: Session, body: Callable) -> None:
    @outbox.transactional(producer=producer)
    def place(*, session: Session) -> None:
        body(session)

    place(session=session)


def run_in_context_with(producer: OutboxProducer, session: Session, body: Callable) -> None:
    with producer.transaction(session) as txn:
        assert txn.session is session
        body(session)


def test_the_isolation_level_a_transaction_chooses_first_is_kept_or_refused(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
) -> None:
    # SQLAlchemy's way to choose one transaction's isolation level is the session's first call,
    # session.connection(execution_options=...); it is ignored once the session has a
    # connection, so the outbox must not have checked one out before the caller's code runs
    level = "SERIALIZABLE"
    chosen = f"chosen-{uuid.uuid4().hex[:8]}"
    seen: list[str] = []
    with pipeline(kafka_bootstrap, topics) as running:

        @outbox.transactional(producer=producer, session_factory=sessionmaker(engine))
        def place(order_id: str, isolation_level: str, *, session: Session) -> None:
            connection = session.connection(execution_options={"isolation_level": isolation_level})
            seen.append(connection.get_isolation_level())
            outbox.send(running.topic, order_id, key=order_id)
            _insert(session, order_id)

        place(chosen, level)
        # and choosing autocommit that way is refused before anything is written
        refused = f"refused-{uuid.uuid4().hex[:8]}"
        with pytest.raises(AutocommitSessionError):
            place(refused, "AUTOCOMMIT")
        # and so is a session the caller passes in, already in an autocommit transaction
        passed = f"passed-{uuid.uuid4().hex[:8]}"
        with Session(sa.create_engine(db_url, isolation_level="AUTOCOMMIT")) as session:
            session.execute(sa.select(1))
            with pytest.raises(AutocommitSessionError):
                place(passed, level, session=session)
        delivered = running.settle(lambda: {chosen})
    assert seen == [level]
    assert delivered == {chosen: 1}
    assert {chosen, refused, passed} & set(order_ids(engine)) == {chosen}


def test_an_autocommit_read_replica_beside_the_evidence_database_is_not_refused(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
) -> None:
    # Given a session whose writes and evidence row go to the primary, and one table read
    # from a "replica" bound in autocommit (here the same database through its own engine)
    replica = sa.create_engine(db_url, isolation_level="AUTOCOMMIT")
    order_id = f"replica-{uuid.uuid4().hex[:8]}"
    with pipeline(kafka_bootstrap, topics) as running:

        @outbox.transactional(
            producer=producer,
            session_factory=sessionmaker(bind=engine, binds={horizon_table: replica}),
        )
        def place(*, session: Session) -> None:
            session.execute(sa.select(horizon_table)).all()  # the replica's connection begins
            outbox.send(running.topic, order_id, key=order_id)
            _insert(session, order_id)

        place()
        # Then it commits and is delivered once
        assert running.settle(lambda: {order_id}) == {order_id: 1}
    assert order_id in order_ids(engine)
    replica.dispose()

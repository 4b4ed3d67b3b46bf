"""An outbox transaction writes one database, its evidence row's (:mod:`outbox.other_databases`).

A session with several binds commits its databases one after another, each on its own, in no
fixed order: a write in a second database is not part of the outbox transaction. When that
database's COMMIT fails after the evidence row's succeeded, the messages announce writes that
never happened; when it succeeds and the evidence row's fails, the writes stay with no message.
Such a write is refused before any database commits; a read of a second database is not. A
horizontally sharded session routes every statement to a shard of its choosing and is refused
before the caller's code runs.

The second database is the other kind from the parametrised one (SQLite beside PostgreSQL,
PostgreSQL beside SQLite), so both ways of asking a database whether it was written are walked.
Each scenario ends where a user looks: the rows in both databases, what a ``read_committed``
consumer of the real topic receives, and the op the outbox wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.ext.horizontal_shard import ShardedSession
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

import outbox
from outbox import MultipleDatabasesError, OutboxProducer
from outbox.protocol.states import DecidedBy
from tests.checker.test_checker import SECRET
from tests.outbox.test_asyncio import async_url
from tests.pipeline import pipeline
from tests.producer_fixtures import Topics, order_ids, orders

pytestmark = pytest.mark.integration

ledger_metadata = sa.MetaData()
accounts = sa.Table(
    "ledger_accounts", ledger_metadata, sa.Column("id", sa.String(64), primary_key=True)
)
entries = sa.Table(
    "ledger_entries",
    ledger_metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column(
        "account",
        sa.String(64),
        # checked at COMMIT: an entry for a missing account fails the second database's commit
        sa.ForeignKey("ledger_accounts.id", deferrable=True, initially="DEFERRED"),
        nullable=False,
    ),
)
ACCOUNT = "acct-1"


class _Ledger(DeclarativeBase):
    metadata = ledger_metadata


class Entry(_Ledger):
    __table__ = entries


@pytest.fixture
def second_url(db_url: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A second database, of the other kind than ``db_url``'s, with the ledger tables."""
    admin: sa.Engine | None = None
    if db_url.startswith("sqlite"):
        admin = sa.create_engine(
            request.getfixturevalue("postgres_url"), isolation_level="AUTOCOMMIT"
        )
        name = f"ledger_{uuid.uuid4().hex[:8]}"
        with admin.connect() as conn:
            conn.execute(sa.text(f"CREATE DATABASE {name}"))
        url = admin.url.set(database=name).render_as_string(hide_password=False)
    else:
        url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with_ledger(url)
    yield url
    if admin is not None:
        with admin.connect() as conn:
            conn.execute(sa.text(f"DROP DATABASE {name} WITH (FORCE)"))
        admin.dispose()


def with_ledger(url: str) -> None:
    """The ledger tables in the database at ``url``, with the account ``ACCOUNT``."""
    setup = ledger_engine(url)
    ledger_metadata.create_all(setup)
    with setup.begin() as conn:
        if not conn.execute(sa.select(accounts.c.id).where(accounts.c.id == ACCOUNT)).first():
            conn.execute(accounts.insert().values(id=ACCOUNT))
    setup.dispose()


def ledger_engine(url: str) -> sa.Engine:
    engine = sa.create_engine(url)
    if url.startswith("sqlite"):  # SQLite checks foreign keys only when asked, per connection
        event.listen(engine, "connect", _foreign_keys_on)
    return engine


def _foreign_keys_on(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.execute("PRAGMA foreign_keys=ON")


@pytest.fixture
def second(second_url: str) -> Iterator[sa.Engine]:
    engine = ledger_engine(second_url)
    yield engine
    engine.dispose()


def ledger_ids(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        found = conn.execute(sa.select(entries.c.id)).scalars()
        return set(found) | set(conn.execute(sa.select(accounts.c.id)).scalars())


def ledger_in(engine: sa.Engine, ledger: sa.Engine | sa.Connection) -> sessionmaker[Session]:
    """Orders and the evidence row through ``engine``, the ledger through ``ledger``."""
    return sessionmaker(bind=engine, binds={Entry: ledger, entries: ledger, accounts: ledger})


Body = Callable[[Session, str, str], None]


def _order(session: Session, topic: str, order_id: str) -> None:
    outbox.send(topic, order_id, key=order_id)
    session.execute(orders.insert().values(id=order_id, amount=1))


def entry_commit_fails(session: Session, topic: str, order_id: str) -> None:
    """The order, and a ledger entry whose COMMIT would fail (its account does not exist)."""
    _order(session, topic, order_id)
    session.execute(entries.insert().values(id=order_id, account="no-such-account"))


def account_written(session: Session, topic: str, order_id: str) -> None:
    """The order, and a ledger row that would commit."""
    _order(session, topic, order_id)
    session.execute(accounts.insert().values(id=order_id))


def entry_flushed_by_the_commit(session: Session, topic: str, order_id: str) -> None:
    """An ORM object for the ledger, first written in the flush the COMMIT starts with."""
    _order(session, topic, order_id)
    session.add(Entry(id=order_id, account=ACCOUNT))


def refusal_caught(session: Session, topic: str, order_id: str) -> None:
    """The refusal, raised by an explicit flush, caught; the code carries on."""
    _order(session, topic, order_id)
    session.add(Entry(id=order_id, account=ACCOUNT))
    with contextlib.suppress(MultipleDatabasesError):
        session.flush()


def in_a_savepoint(session: Session, topic: str, order_id: str) -> None:
    """The ledger written inside a savepoint."""
    _order(session, topic, order_id)
    with session.begin_nested():
        session.execute(accounts.insert().values(id=order_id))


def run_decorated(producer: OutboxProducer, factory: Any, body: Callable) -> None:
    """``body`` under ``@outbox.transactional``, given a session factory or a session."""
    given = isinstance(factory, Session)
    options = {} if given else {"session_factory": factory}

    @outbox.transactional(producer=producer, **options)
    def place(*, session: Session) -> None:
        body(session)

    place(session=factory) if given else place()


def run_in_context(producer: OutboxProducer, factory: Any, body: Callable) -> None:
    with producer.transaction(factory) as txn:
        assert txn.session is not None
        body(txn.session)


@pytest.mark.parametrize("form", [run_decorated, run_in_context], ids=["decorator", "with"])
def test_a_write_in_a_second_database_is_refused_before_any_database_commits(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    engine: sa.Engine,
    db_url: str,
    second: sa.Engine,
    topics: Topics,
    form: Callable[..., None],
) -> None:
    producer.serve_checks(engine=engine, secret=SECRET)
    two = ledger_in(engine, second)
    # a second engine on the orders' own database: a connection, and a transaction, of its own
    with_ledger(db_url)
    same = ledger_in(engine, engine.execution_options(logging_token="ledger"))
    # a session event of the caller's own that writes the ledger as the session commits
    by_listener = ledger_in(engine, second)

    @event.listens_for(by_listener, "before_commit")
    def _journal(session: Session) -> None:
        session.execute(accounts.insert().values(id=session.info["order_id"]))

    def listener_body(session: Session, topic: str, order_id: str) -> None:
        session.info["order_id"] = order_id
        _order(session, topic, order_id)

    with pipeline(kafka_bootstrap, topics) as running:
        # a session passed in already begun, holding the ledger's connection (it read it)
        begun = two()
        begun.execute(sa.select(accounts.c.id)).all()
        # Given a session with the orders and the evidence row in one database and a ledger in
        # another, transactions that send, write an order, and write the ledger, each its way
        scenarios: dict[str, tuple[Any, Body]] = {
            "a ledger entry whose commit fails": (two, entry_commit_fails),
            "a ledger row": (two, account_written),
            "an ORM object flushed by the COMMIT": (two, entry_flushed_by_the_commit),
            "the refusal caught": (two, refusal_caught),
            "in a savepoint": (two, in_a_savepoint),
            "a second engine on the same database": (same, account_written),
            "the caller's before_commit listener": (by_listener, listener_body),
            "a session passed in, begun on the ledger": (begun, account_written),
        }
        refused: dict[str, str] = {}
        raised: dict[str, BaseException | None] = {}
        for name, (factory, body) in scenarios.items():
            order_id = refused[name] = f"two-{uuid.uuid4().hex[:8]}"
            try:
                form(producer, factory, lambda s, b=body, i=order_id: b(s, running.topic, i))
                raised[name] = None
            except Exception as err:
                raised[name] = err
        begun.close()
        # and one that only reads the ledger
        read = f"read-{uuid.uuid4().hex[:8]}"

        def reads_the_ledger(session: Session) -> None:
            _order(session, running.topic, read)
            assert session.execute(sa.select(accounts.c.id)).scalars().all() == [ACCOUNT]

        form(producer, two, reads_the_ledger)
        # Then the writing ones were refused by name, before the write ran
        assert {n: type(e) for n, e in raised.items()} == dict.fromkeys(
            refused, MultipleDatabasesError
        )
        assert all(
            "other than the one the outbox's evidence row" in str(e) for e in raised.values()
        )
        delivered = running.settle(lambda: {read})
        ids = set(refused.values())
        report = (
            sorted(ids & set(order_ids(engine))),
            sorted(ids & (ledger_ids(second) | ledger_ids(engine))),
            sorted(ids & set(delivered)),
        )
        assert report == ([], [], []), "(orders, ledger rows, orders delivered)"
        # and each was rolled back by the outbox itself (its ROLLBACK op, not a check's); the
        # reading one committed
        sent = {h.message.value.decode(): h.txn_id for h in topics.halves()}
        assert set(sent) == ids | {read}
        running.decided(sent.values())
        by_producer = {
            op.txn_id: op.state.value for op in topics.ops() if op.decided_by is DecidedBy.PRODUCER
        }
        assert {n: by_producer.get(sent[i]) for n, i in refused.items()} == dict.fromkeys(
            refused, "ROLLBACK"
        )
        assert by_producer[sent[read]] == "COMMIT"
        assert read in order_ids(engine)
        assert delivered == {read: 1}


def test_an_async_write_in_a_second_database_is_refused(
    producer: OutboxProducer,
    engine: sa.Engine,
    db_url: str,
    second_url: str,
    second: sa.Engine,
    topics: Topics,
) -> None:
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    core, orm, read = (f"async-{what}-{uuid.uuid4().hex[:8]}" for what in ("core", "orm", "read"))
    raised: dict[str, type[BaseException] | None] = {}

    async def run() -> None:
        main = create_async_engine(async_url(db_url))
        ledger = create_async_engine(async_url(second_url))
        if second_url.startswith("sqlite"):
            event.listen(ledger.sync_engine, "connect", _foreign_keys_on)
        factory = async_sessionmaker(
            bind=main, binds={Entry: ledger, entries: ledger, accounts: ledger}
        )

        @outbox.transactional(producer=producer, session_factory=factory)
        async def place(order_id: str, how: str, *, session: AsyncSession) -> None:
            await outbox.send(topic, order_id, key=order_id)
            await session.execute(orders.insert().values(id=order_id, amount=1))
            if how == "core":
                await session.execute(accounts.insert().values(id=order_id))
            elif how == "orm":
                session.add(Entry(id=order_id, account=ACCOUNT))
            else:
                assert (await session.execute(sa.select(accounts.c.id))).scalars().all()

        try:
            for order_id, how in ((core, "core"), (orm, "orm"), (read, "read")):
                try:
                    await place(order_id, how)
                    raised[how] = None
                except Exception as err:
                    raised[how] = type(err)
        finally:
            await main.dispose()
            await ledger.dispose()

    asyncio.run(run())
    assert raised == {"core": MultipleDatabasesError, "orm": MultipleDatabasesError, "read": None}
    assert {core, orm} & (set(order_ids(engine)) | ledger_ids(second)) == set()
    assert read in order_ids(engine)
    sent = {h.message.value.decode(): h.txn_id for h in topics.halves()}
    states = {op.txn_id: op.state.value for op in topics.ops()}
    assert {i: states[sent[i]] for i in (core, orm, read)} == {
        core: "ROLLBACK",
        orm: "ROLLBACK",
        read: "COMMIT",
    }


def test_a_sharded_session_is_refused_before_the_code_runs(
    producer: OutboxProducer,
    engine: sa.Engine,
    db_url: str,
    second_url: str,
    second: sa.Engine,
    topics: Topics,
) -> None:
    ran: list[str] = []
    ids = [f"sharded-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    shards = {"main": engine, "ledger": second}
    chooser: dict[str, Any] = {
        "shard_chooser": lambda mapper, instance, clause=None: "main",
        "identity_chooser": lambda *args, **kwargs: ["main"],
        "execute_chooser": lambda context: ["main"],
    }
    factory = sessionmaker(class_=ShardedSession, shards=shards, **chooser)

    # When a transaction is given a horizontally sharded session, in each form
    for form, order_id in zip((run_decorated, run_in_context), ids, strict=True):

        def body(session: Session, order_id: str = order_id) -> None:
            ran.append(order_id)
            _order(session, "orders", order_id)

        with pytest.raises(MultipleDatabasesError, match="sessionmaker\\(bind=shards"):
            form(producer, factory, body)

    async def run_async() -> None:
        main = create_async_engine(async_url(db_url))
        ledger = create_async_engine(async_url(second_url))
        try:
            async_factory = async_sessionmaker(
                sync_session_class=ShardedSession,
                shards={"main": main.sync_engine, "ledger": ledger.sync_engine},
                **chooser,
            )

            @outbox.transactional(producer=producer, session_factory=async_factory)
            async def place(*, session: AsyncSession) -> None:
                ran.append("ran")

            with pytest.raises(MultipleDatabasesError, match="ShardedSession"):
                await place()
        finally:
            await main.dispose()
            await ledger.dispose()

    asyncio.run(run_async())
    # Then the code never ran, and nothing was sent or written
    assert ran == []
    assert topics.halves() == []
    assert set(ids) & set(order_ids(engine)) == set()

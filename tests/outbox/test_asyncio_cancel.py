"""An asyncio transaction cancelled wherever it is: the database and the topic still agree.

asyncio code is cancelled all the time: a request under ``asyncio.timeout()`` or
``asyncio.wait_for()``, a task group whose sibling failed, a server shutting down. The
cancellation lands wherever the transaction is awaiting - in the caller's own code, in a half
send whose record then reaches the broker anyway, in the database's COMMIT, or in the op's
acknowledgement after the COMMIT. Each case runs in ``async def`` under ``@outbox.transactional``
and in ``async with producer.transaction()`` against a real relay and checker, and ends with a
``read_committed`` read of the real topic beside the rows: an order is delivered, once, if and
only if its row committed.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session

import outbox
from outbox import OutboxProducer
from outbox.testing import HarnessSettings
from outbox.testing.kafka_process import KafkaProcess
from outbox.testing.stopping import freeze, thaw
from tests.checker.test_checker import SECRET
from tests.outbox.test_asyncio import async_url
from tests.outbox.test_broker_down import late_settings, pausable_broker
from tests.pipeline import pipeline
from tests.producer_fixtures import Topics

pytestmark = [pytest.mark.integration, pytest.mark.processes]

#: How long the caller lets a transaction run before cancelling it.
DEADLINE_S = 0.5
#: How long a paused broker or a slow COMMIT holds the transaction: past the deadline.
HOLD_S = 1.5

cancel_orders = sa.Table(
    "cancel_orders",
    sa.MetaData(),
    sa.Column("id", sa.String(64), primary_key=True),
)

#: PostgreSQL: a COMMIT holding an order whose id starts with "slow-" takes HOLD_S (a deferred
#: constraint trigger runs at COMMIT), so the cancellation lands inside it.
SLOW_COMMIT = [
    f"""CREATE OR REPLACE FUNCTION cancel_orders_slow() RETURNS trigger AS $$
    BEGIN
        IF starts_with(NEW.id, 'slow-') THEN PERFORM pg_sleep({HOLD_S}); END IF;
        RETURN NULL;
    END $$ LANGUAGE plpgsql""",
    "DROP TRIGGER IF EXISTS cancel_orders_slow ON cancel_orders",
    """CREATE CONSTRAINT TRIGGER cancel_orders_slow AFTER INSERT ON cancel_orders
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION cancel_orders_slow()""",
]


class Watched(Session):
    """The sync session under the test's ``AsyncSession``s, so that one scenario can pause the
    broker the moment its COMMIT is done."""


@dataclass
class Broker:
    process: KafkaProcess
    pause_after_commit: bool = False
    #: The timers that make it answer again, one per pause.
    resumes: list[threading.Thread] = field(default_factory=list)

    def pause(self) -> None:
        """Stop it answering now (SIGSTOP: its connections stay open), again HOLD_S later."""
        assert self.process.proc is not None
        pid = self.process.proc.pid
        freeze(pid)
        resume = threading.Timer(HOLD_S, thaw, (pid,))
        resume.start()
        self.resumes.append(resume)

    def answering(self) -> None:
        """Wait until every pause is over."""
        for resume in self.resumes:
            resume.join()
        self.resumes.clear()


Send = Callable[[str], Awaitable[object]]
Body = Callable[[AsyncSession, Send, str, Broker], Awaitable[None]]


async def _insert(session: AsyncSession, order_id: str) -> None:
    await session.execute(cancel_orders.insert().values(id=order_id))


async def asleep_after_a_send(s: AsyncSession, send: Send, order_id: str, _: Broker) -> None:
    await send(order_id)
    await _insert(s, order_id)
    await asyncio.sleep(30)  # the caller's own slow await


async def asleep_before_any_send(s: AsyncSession, send: Send, order_id: str, _: Broker) -> None:
    await _insert(s, order_id)
    await asyncio.sleep(30)


async def in_the_half_send(s: AsyncSession, send: Send, order_id: str, broker: Broker) -> None:
    await _insert(s, order_id)
    broker.pause()  # the record reaches the broker HOLD_S later, after the cancellation
    await send(order_id)


async def in_the_commit(s: AsyncSession, send: Send, order_id: str, _: Broker) -> None:
    await _insert(s, order_id)  # a "slow-" id: its COMMIT takes HOLD_S
    await send(order_id)


async def in_the_op(s: AsyncSession, send: Send, order_id: str, broker: Broker) -> None:
    await _insert(s, order_id)
    await send(order_id)
    broker.pause_after_commit = True  # the op then waits for the paused broker


@dataclass
class Case:
    body: Body
    #: Whether the order commits: None when the cancellation lands where either may be true.
    commits: bool | None
    prefix: str = ""
    postgresql_only: bool = False


CASES = {
    "asleep after a send": Case(asleep_after_a_send, commits=False),
    "asleep before any send": Case(asleep_before_any_send, commits=False),
    "in the half send": Case(in_the_half_send, commits=False),
    "in the COMMIT": Case(in_the_commit, commits=None, prefix="slow-", postgresql_only=True),
    "in the op": Case(in_the_op, commits=True),
}

Form = Callable[
    [OutboxProducer, async_sessionmaker[AsyncSession], str, Case, str, Broker], Awaitable[None]
]


async def decorated(
    producer: OutboxProducer,
    factory: async_sessionmaker[AsyncSession],
    topic: str,
    case: Case,
    order_id: str,
    broker: Broker,
) -> None:
    @outbox.transactional(producer=producer, session_factory=factory)
    async def place(*, session: AsyncSession) -> None:
        await case.body(
            session, lambda order: outbox.send(topic, order, key=order), order_id, broker
        )

    await place()


async def in_context(
    producer: OutboxProducer,
    factory: async_sessionmaker[AsyncSession],
    topic: str,
    case: Case,
    order_id: str,
    broker: Broker,
) -> None:
    async with producer.transaction(factory) as txn:
        assert isinstance(txn.session, AsyncSession)
        await case.body(
            txn.session, lambda order: txn.send(topic, order, key=order), order_id, broker
        )


FORMS: dict[str, Form] = {"decorator": decorated, "with": in_context}


def test_a_cancelled_async_transaction_ends_with_the_database_and_the_topic_agreeing(
    harness_settings: HarnessSettings, tmp_path: Path, engine: sa.Engine, db_url: str
) -> None:
    postgresql = not db_url.startswith("sqlite")
    cancel_orders.metadata.create_all(engine)
    if postgresql:
        with engine.begin() as conn:
            for statement in SLOW_COMMIT:
                conn.exec_driver_sql(statement)
    cases = [
        (form, name)
        for form in FORMS
        for name, case in CASES.items()
        if postgresql or not case.postgresql_only
    ]
    with pausable_broker(harness_settings, tmp_path) as process:
        broker = Broker(process)
        settings = late_settings(process)  # sends wait out a pause; the op is awaited
        topics = Topics(process.bootstrap, settings)

        def after_commit(session: Any) -> None:
            if broker.pause_after_commit:
                broker.pause_after_commit = False
                broker.pause()

        order_of: dict[tuple[str, str], str] = {}
        raised: dict[tuple[str, str], type[BaseException] | None] = {}
        with OutboxProducer(settings) as producer, pipeline(process.bootstrap, topics) as running:
            producer.serve_checks(engine=engine, secret=SECRET)

            async def main() -> None:
                async_engine = create_async_engine(async_url(db_url))
                factory = async_sessionmaker(
                    async_engine, expire_on_commit=False, sync_session_class=Watched
                )
                try:
                    # the producer knows its broker first: the first send of a fresh producer
                    # takes longer than the deadline, which would move the cancellation into it
                    warm_up = f"warm-up-{uuid.uuid4().hex[:12]}"
                    async with producer.transaction(factory) as txn:
                        assert isinstance(txn.session, AsyncSession)
                        await _insert(txn.session, warm_up)
                        await txn.send(running.topic, warm_up, key=warm_up)
                    for form, name in cases:
                        case = CASES[name]
                        order_id = f"{case.prefix}{uuid.uuid4().hex[:12]}"
                        order_of[form, name] = order_id
                        raised[form, name] = None
                        # When the caller gives the transaction DEADLINE_S
                        try:
                            await asyncio.wait_for(
                                FORMS[form](
                                    producer, factory, running.topic, case, order_id, broker
                                ),
                                DEADLINE_S,
                            )
                        except Exception as err:
                            raised[form, name] = type(err)
                        broker.answering()
                finally:
                    await async_engine.dispose()

            sa.event.listen(Watched, "after_commit", after_commit)
            try:
                asyncio.run(main())
            finally:
                sa.event.remove(Watched, "after_commit", after_commit)
            # Then each was cancelled: the caller got the timeout, whatever the outcome
            assert raised == {c: TimeoutError for c in cases}
            with engine.connect() as conn:
                rows = set(conn.execute(sa.select(cancel_orders.c.id)).scalars())
            committed = {c: order_of[c] in rows for c in cases}
            assert committed == {
                c: committed[c] if CASES[c[1]].commits is None else CASES[c[1]].commits
                for c in cases
            }
            # And an order is delivered, once, if and only if its row committed
            expected = {order_of[c] for c in cases if committed[c]}
            delivered = running.settle(lambda: expected)
            assert all(n == 1 for n in delivered.values()), delivered
            ours = set(order_of.values())
            assert set(delivered) & ours == expected, {
                c: (committed[c], order_of[c] in delivered) for c in cases
            }

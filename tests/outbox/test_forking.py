"""A producer made before its process forked (:mod:`outbox.forking`): gunicorn ``--preload``,
uWSGI, Celery's prefork pool, ``multiprocessing``'s ``fork``.

Before, a forked worker's every half send timed out (librdkafka's threads do not survive a fork)
and its every transaction rolled back with a ``HalfSendError`` asking whether Kafka was up; its
``close()`` waited for ever on the parent's check server. The scenarios fork workers from a
process whose producer has sent and serves checks, as a preloading server's master would, and
end where a user looks: the rows, what a ``read_committed`` consumer of the real topic receives,
and the op that decided each transaction.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker

import outbox
from outbox import (
    LocalTransactionState,
    Message,
    OutboxProducer,
    OutboxSettings,
    ProducerClosedError,
    TransactionalProducer,
)
from outbox.forking import PerProcess
from outbox.protocol.states import DecidedBy
from tests.checker.test_checker import SECRET
from tests.outbox.test_asyncio import async_url
from tests.pipeline import ops_lost, pipeline
from tests.producer_fixtures import Topics, order_ids, orders

FORK = multiprocessing.get_context("fork")


def in_workers(count: int, work: Callable[[int], object], timeout: float = 60) -> list[object]:
    """``work(i)`` in ``count`` workers forked at once; what each returned, or the error it raised
    (``"TypeName: message"``), or ``"hung"`` when it had not ended within ``timeout``."""
    queue = FORK.SimpleQueue()

    def worker(i: int) -> None:
        try:
            queue.put((i, work(i)))
        except BaseException as err:  # reported, not raised: the test asserts on it
            queue.put((i, f"{type(err).__name__}: {err}"))

    workers = [FORK.Process(target=worker, args=(i,)) for i in range(count)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout)
    reported: list[object] = ["hung"] * count
    for w in workers:
        if w.is_alive():
            w.kill()
            w.join()
    while not queue.empty():
        i, result = queue.get()
        reported[i] = result
    return reported


# --- PerProcess, without services


def test_a_per_process_value_is_made_once_per_process() -> None:
    made: list[int] = []

    def make() -> int:
        made.append(len(made))
        return len(made)

    value = PerProcess(make, "test values")
    assert [value.get(), value.get()] == [1, 1]

    def in_child(_: int) -> tuple[int, ...]:
        # eight threads ask at once, the first time in the child: one value is made
        got: list[int] = []
        threads = [threading.Thread(target=lambda: got.append(value.get())) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return (len(made), *sorted(set(got)))

    # Then a forked child makes its own value, once (the parent had made one: 1, so 2)
    assert in_workers(2, in_child) == [(2, 2), (2, 2)]
    # and the parent keeps its own
    assert value.get() == 1
    assert made == [0]


# --- the producer in forked workers, against the real pipeline


class OrderListener:
    """RocketMQ's listener form: the listener writes the order and commits it."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        with self.engine.begin() as conn:
            conn.execute(orders.insert().values(id=arg, amount=1))
        return LocalTransactionState.COMMIT

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        with self.engine.connect() as conn:
            found = conn.execute(sa.select(orders.c.id).where(orders.c.id == msg.value.decode()))
            return LocalTransactionState.COMMIT if found.first() else LocalTransactionState.UNKNOWN


def each_form(
    producer: OutboxProducer,
    factory: sessionmaker[Session],
    listened: TransactionalProducer,
    db_url: str,
    topic: str,
    prefix: str,
) -> list[str]:
    """One order in each public form: the decorator, ``with``, the listener form, asyncio; the
    order ids."""
    ids = [f"{prefix}-{form}-{uuid.uuid4().hex[:6]}" for form in ("dec", "with", "rmq", "async")]

    @outbox.transactional(producer=producer, session_factory=factory)
    def decorated(*, session: Session) -> None:
        outbox.send(topic, ids[0], key=ids[0])
        session.execute(orders.insert().values(id=ids[0], amount=1))

    decorated()
    with producer.transaction(factory) as txn:
        txn.send(topic, ids[1], key=ids[1])
        txn.session.execute(orders.insert().values(id=ids[1], amount=1))
    result = listened.send_message_in_transaction(Message(topic, ids[2], key=ids[2]), arg=ids[2])
    assert result.local_transaction_state is LocalTransactionState.COMMIT

    async def in_asyncio() -> None:
        engine = create_async_engine(async_url(db_url))  # an asyncio engine is its loop's
        try:
            async with producer.transaction(async_sessionmaker(engine)) as txn:
                await txn.send(topic, ids[3], key=ids[3])
                await txn.session.execute(orders.insert().values(id=ids[3], amount=1))
        finally:
            await engine.dispose()

    asyncio.run(in_asyncio())
    return ids


@pytest.mark.integration
def test_workers_forked_after_the_producer_was_made_deliver_every_form(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a producer that has sent, serves checks and has a listener, in the process that
    # then forks its workers (a preloading server's master)
    producer.serve_checks(engine=engine, secret=SECRET)
    factory = sessionmaker(engine)
    listened = TransactionalProducer(producer, OrderListener(engine))
    with pipeline(kafka_bootstrap, topics) as running:
        forms = (producer, factory, listened, db_url, running.topic)
        before = each_form(*forms, "parent")

        def worker(i: int) -> list[str]:
            engine.dispose(close=False)  # SQLAlchemy's advice for a pool inherited by a fork
            ids = each_form(*forms, f"worker{i}")
            producer.close()
            try:
                each_form(*forms, f"closed{i}")
            except ProducerClosedError:
                return ids
            raise AssertionError("a send after close() was not refused")

        # When two workers send in every form, each then closing its producer
        reported = in_workers(2, worker)
        # Then each worker's transactions committed (before: HalfSendError, Kafka "down")
        assert all(isinstance(r, list) for r in reported), reported
        worker_ids = [i for r in reported for i in r]  # type: ignore[union-attr]
        # and the parent still sends, and still answers checks: its own clients, its own
        # endpoint, neither closed by the workers
        after = each_form(*forms, "after")
        with ops_lost(producer, monkeypatch):  # resolved by the parent's endpoint's answers
            unresolved = each_form(*forms, "oplost")
        wanted = {*before, *worker_ids, *after, *unresolved}
        delivered = running.settle(lambda: wanted)
        assert delivered == dict.fromkeys(wanted, 1)
        assert wanted <= set(order_ids(engine))
        sent = {h.message.value.decode(): h.txn_id for h in topics.halves()}
        decided = running.decided(sent[i] for i in wanted)
        assert set(decided.values()) == {"COMMIT"}
        by_checker = {op.txn_id for op in topics.ops() if op.decided_by is DecidedBy.CHECKER}
        assert {sent[i] for i in unresolved} <= by_checker


@pytest.mark.integration
def test_a_forked_worker_closes_only_what_it_started(
    producer: OutboxProducer, engine: sa.Engine
) -> None:
    # Given a producer serving checks in the process that forks its workers
    server = producer.serve_checks(engine=engine, secret=SECRET)

    def worker(_: int) -> str:
        producer.close()  # a worker's shutdown hook
        return "closed"

    # When workers that never sent close it (before: each waited for ever on the parent's
    # check server, whose thread is not in the worker)
    assert in_workers(2, worker, timeout=30) == ["closed", "closed"]
    # Then the parent's endpoint still answers (a 404 for a path it does not serve), and the
    # parent still sends through its own clients
    with pytest.raises(urllib.error.HTTPError) as answered:
        urllib.request.urlopen(f"{server.url}/nowhere", timeout=5)
    assert answered.value.code == 404
    with producer.transaction(sessionmaker(engine)) as txn:
        txn.send("orders", b"after", key=b"after")
        assert txn.session is not None
        txn.session.execute(orders.insert().values(id=f"after-{uuid.uuid4().hex[:6]}", amount=1))


@pytest.mark.integration
def test_a_producer_closed_before_the_fork_stays_closed_in_the_worker(
    outbox_settings: OutboxSettings, engine: sa.Engine
) -> None:
    producer = OutboxProducer(outbox_settings)
    producer.close()

    def worker(_: int) -> str:
        engine.dispose(close=False)
        with producer.transaction(sessionmaker(engine)) as txn:
            txn.send("orders", b"late", key=b"late")
        return "sent"

    assert in_workers(1, worker) == [
        "ProducerClosedError: this outbox producer is closed; create a new one"
    ]

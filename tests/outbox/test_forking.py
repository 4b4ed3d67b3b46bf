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
import contextlib
import logging
import os
import pickle
import signal
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import Session, sessionmaker

import outbox
from outbox import (
    ForkedWithLockHeldError,
    LocalTransactionState,
    Message,
    OutboxProducer,
    OutboxSettings,
    ProducerClosedError,
    TransactionalProducer,
)
from outbox.checks.routing import OmittedValues
from outbox.forking import PerProcess, check_forked_process
from outbox.kafka_logging import LOGGER_NAME as LIBRDKAFKA_LOGGER
from outbox.protocol.check import CHECK_PATH, CheckedTransaction
from outbox.protocol.states import CheckBy, DecidedBy
from tests.checker.test_checker import SECRET, checker_and_relay
from tests.kafka_helpers import create_topic, unique
from tests.outbox.test_asyncio import async_url
from tests.pipeline import Pipeline, ops_lost, pipeline
from tests.producer_fixtures import Topics, order_ids, orders

#: Two workers, forked as gunicorn, Celery and multiprocessing fork (``os.fork``: Python's at-fork
#: hooks run). A fork from C that skips them (uWSGI without ``--py-call-osafterfork``) is not
#: tested: CPython itself is not safe there once threads ran before the fork (a test of it hung
#: in 3 of about 10 runs, inside the interpreter).
TWO = (os.fork, os.fork)


#: What a worker reports when it was forked while a thread of the test's process held a lock its
#: Kafka clients need (:func:`outbox.fork_checks.check_forked_process`).
STUCK = "forked with a lock held"


def in_workers(
    work: Callable[[int], object],
    forks: Sequence[Callable[[], int]],
    *,
    timeout: float = 60,
    own_group: bool = True,
    fork_again_if_stuck: int = 3,
) -> list[object]:
    """``work(i)`` in a worker forked by each of ``forks``, one after another; what each
    returned, or the error it raised (``"TypeName: message"``), ``"hung"`` when it had not
    exited by ``timeout``, or its exit status when it exited without a report. Each is the
    leader of a process group of its own (``own_group``), so that a timeout kills its own workers
    too (which stay in its group).

    A worker forked while one of this process's threads (a Kafka client's, connecting) held a
    lock its Kafka clients need can never connect one (:mod:`outbox.fork_checks`), whatever it
    is meant to show; with ``fork_again_if_stuck``, each worker first checks that
    (:func:`~outbox.fork_checks.check_forked_process`) and one that is stuck is forked again, up to
    that many times. ``0``: not checked here, ``work`` meets it as a user's code would.
    """
    reported: dict[int, object] = {}
    pending = list(range(len(forks)))
    for attempt in range(fork_again_if_stuck + 1):
        check = attempt < fork_again_if_stuck
        reported.update(
            _fork_each(work, [(i, forks[i]) for i in pending], timeout, own_group, check)
        )
        pending = [i for i in pending if reported[i] == STUCK]
        if not pending:
            break
        print(f"workers {pending} were forked with a lock held: forked again")
    return [reported[i] for i in range(len(forks))]


def _fork_each(
    work: Callable[[int], object],
    forks: Sequence[tuple[int, Callable[[], int]]],
    timeout: float,
    own_group: bool,
    check: bool,
) -> dict[int, object]:
    started: list[tuple[int, int, int]] = []
    for i, fork in forks:
        read_end, write_end = os.pipe()
        pid = fork()
        if pid == 0:  # the worker: reports, then exits without the parent's clean-up
            try:
                if own_group:
                    os.setpgid(0, 0)
                os.close(read_end)
                librdkafka = _lines_of(LIBRDKAFKA_LOGGER)
                try:
                    if check:
                        check_forked_process()  # once it answered, work(i) will not meet it
                    result: object = work(i)
                except BaseException as err:
                    stuck = check and isinstance(err, ForkedWithLockHeldError)
                    result = (
                        STUCK if stuck else f"{type(err).__name__}: {err}{_worker_log(librdkafka)}"
                    )
                with os.fdopen(write_end, "wb") as out:
                    out.write(pickle.dumps(result))
            finally:  # whatever happened, never back into the test session
                os._exit(0)
        os.close(write_end)
        started.append((i, pid, read_end))
    deadline = time.monotonic() + timeout
    reported: dict[int, object] = {}
    for i, pid, read_end in started:
        status: int | None = None
        while status is None and time.monotonic() < deadline:
            done, code = os.waitpid(pid, os.WNOHANG)
            status = os.waitstatus_to_exitcode(code) if done else None
            time.sleep(0 if done else 0.05)
        if status is None:
            (os.killpg if own_group else os.kill)(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(read_end)
            reported[i] = "hung"
            continue
        with os.fdopen(read_end, "rb") as given:
            report = given.read()
        if status != 0 or not report:
            reported[i] = f"exit status {status}, no report"
        else:
            reported[i] = pickle.loads(report)
    return reported


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.created:.3f} {record.getMessage()}")


def _lines_of(logger: str) -> list[str]:
    """What ``logger`` logs from now on in this process (INFO and up), formatted."""
    handler = _Lines()
    logging.getLogger(logger).addHandler(handler)
    logging.getLogger(logger).setLevel(logging.INFO)
    return handler.lines


def _worker_log(lines: list[str]) -> str:
    """A failed worker's librdkafka lines, to tell why its clients failed (an error a worker
    met once in CI, "Failed to get metadata: Local: Broker transport failure" after its whole
    timeout, was never seen again locally); empty if it logged none."""
    if not lines:
        return ""
    return "\nthe worker's librdkafka log (last 40 lines):\n" + "\n".join(lines[-40:])


# --- PerProcess, without services


def test_a_per_process_value_is_made_once_per_process() -> None:
    made: list[str] = []

    def make() -> str:
        time.sleep(0.05)  # long enough for every thread below to ask while it is being made
        made.append(f"{os.getpid()}")
        return made[-1]

    value = PerProcess(make, "test values")
    parent = value.get()
    assert value.get() == parent

    def in_child(_: int) -> dict[str, object]:
        me = f"{os.getpid()}"
        inherited = value.made_here()
        # eight threads ask at once, the first time in this process
        gate = threading.Barrier(8)
        got: list[str] = []

        def ask() -> None:
            gate.wait()
            got.append(value.get())

        threads = [threading.Thread(target=ask) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return {
            "inherited one used here": inherited,
            "values made": len(made),
            "every thread got this process's": set(got) == {me},
            "this process's is its own": value.made_here() == me,
            # a worker forked from this worker makes its own again
            "in a worker's worker": in_workers(
                lambda _: (value.get() == f"{os.getpid()}", len(made)), [os.fork], own_group=False
            ),
        }

    # Then a forked worker makes its own value, once, and so does a worker forked from it
    assert in_workers(in_child, [os.fork]) == [
        {
            "inherited one used here": None,
            "values made": 2,
            "every thread got this process's": True,
            "this process's is its own": True,
            "in a worker's worker": [(True, 3)],
        }
    ]
    # and the parent keeps its own
    assert value.get() == parent
    assert made == [parent]


def test_made_here_waits_for_the_value_another_thread_of_the_child_is_making() -> None:
    """A forked worker's ``close()`` asks ``made_here()`` what to close while another of its
    threads makes the worker's clients. Before, it answered None at once, and the clients that
    thread finished making were never closed; now it waits for them."""
    parent_pid = os.getpid()
    making, finish = threading.Event(), threading.Event()

    def make() -> str:
        if os.getpid() != parent_pid:  # in the worker: slow enough to be asked meanwhile
            making.set()
            finish.wait(10)
        return f"{os.getpid()}"

    value = PerProcess(make, None)

    def in_child(_: int) -> dict[str, object]:
        me = f"{os.getpid()}"
        maker = threading.Thread(target=value.get)
        maker.start()
        making.wait(10)
        threading.Timer(0.3, finish.set).start()  # the maker finishes while made_here() asks
        asked = time.monotonic()
        answer = value.made_here()
        waited = time.monotonic() - asked
        maker.join()
        return {"answer is this worker's value": answer == me, "waited for it": waited >= 0.2}

    assert in_workers(in_child, [os.fork]) == [
        {"answer is this worker's value": True, "waited for it": True}
    ]
    # and the parent's answer is its own value
    assert value.made_here() == f"{parent_pid}"


# --- the producer in forked workers, against the real pipeline


class OrderListener:
    """RocketMQ's listener form: the listener writes the order and commits it; its check
    answers ``absent`` when the row is not there."""

    absent = LocalTransactionState.UNKNOWN

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        with self.engine.begin() as conn:
            conn.execute(orders.insert().values(id=arg, amount=1))
        return LocalTransactionState.COMMIT

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        with self.engine.connect() as conn:
            found = conn.execute(sa.select(orders.c.id).where(orders.c.id == msg.value.decode()))
            return LocalTransactionState.COMMIT if found.first() else self.absent


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
    listened = TransactionalProducer(producer, OrderListener(engine))
    topic = unique("orders")
    create_topic(kafka_bootstrap, topic, partitions=3)
    forms = (producer, sessionmaker(engine), listened, db_url, topic)
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
    reported = in_workers(worker, TWO)
    # Then each worker's transactions committed (before: HalfSendError, Kafka "down")
    assert all(isinstance(r, list) for r in reported), reported
    worker_ids = [i for r in reported for i in r]  # type: ignore[union-attr]
    # and the parent still sends, and still answers checks: its own clients, its own endpoint,
    # neither closed by the workers
    after = each_form(*forms, "after")
    with ops_lost(producer, monkeypatch):  # resolved by the parent's endpoint's answers
        unresolved = each_form(*forms, "oplost")
    wanted = {*before, *worker_ids, *after, *unresolved}
    with checker_and_relay(kafka_bootstrap, topics.settings.topic_prefix) as checker:
        running = Pipeline(kafka_bootstrap, topic, topics, checker)
        delivered = running.settle(lambda: wanted)
        assert delivered == dict.fromkeys(wanted, 1)
        assert wanted <= set(order_ids(engine))
    # each decided COMMIT (the relay promotes on nothing else), the ones whose op was lost by
    # the checker, from the parent's endpoint's answer
    sent = {h.message.value.decode(): h.txn_id for h in topics.halves()}
    ops = topics.ops()
    assert {op.state.value for op in ops if op.txn_id in {sent[i] for i in wanted}} == {"COMMIT"}
    by_checker = {op.txn_id for op in ops if op.decided_by is DecidedBy.CHECKER}
    assert {sent[i] for i in unresolved} <= by_checker


@pytest.mark.integration
def test_a_forked_worker_closes_only_what_it_started(
    producer: OutboxProducer, engine: sa.Engine
) -> None:
    # Given a producer serving checks in the process that forks its workers
    server = producer.serve_checks(engine=engine, secret=SECRET)

    def worker(_: int) -> tuple[str, float]:
        began = time.monotonic()
        server.close()  # what serve_checks() returned: the worker's own shutdown code
        producer.close()  # a worker's shutdown hook
        return "closed", time.monotonic() - began

    # When workers that never sent close the server, then the producer
    reported = in_workers(worker, TWO, timeout=30)
    # Then each returns at once (before: each waited for ever on the parent's check server, whose
    # thread is not in the worker; and 5 s on a tombstone for the parent's heartbeat, whose
    # Kafka client's threads are not there either)
    assert all(isinstance(r, tuple) for r in reported), reported
    assert [r[0] for r in reported] == ["closed", "closed"], reported  # type: ignore[index]
    assert all(r[1] < 2.5 for r in reported), reported  # type: ignore[index]
    # and the parent's endpoint still answers (a GET is refused, by the server itself)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(server.url + CHECK_PATH, timeout=10)
    assert refused.value.code == 405


@pytest.mark.integration
def test_a_producer_closed_before_the_fork_stays_closed_in_the_worker(
    outbox_settings: OutboxSettings, engine: sa.Engine
) -> None:
    """A worker makes no clients for a producer its parent closed (a guard of the remaking:
    without it, the worker's send went out)."""
    producer = OutboxProducer(outbox_settings)
    producer.close()

    def worker(_: int) -> str:
        engine.dispose(close=False)
        with producer.transaction(sessionmaker(engine)) as txn:
            txn.send("orders", b"late", key=b"late")
        return "sent"

    assert in_workers(worker, [os.fork]) == [
        "ProducerClosedError: this outbox producer is closed; create a new one"
    ]


@pytest.mark.integration
def test_a_forked_worker_reads_omitted_values_with_a_reader_of_its_own(
    kafka_bootstrap: str, producer: OutboxProducer, engine: sa.Engine, topics: Topics
) -> None:
    """The check endpoint reads back a value the checker left out of a request (too large for
    it); an ASGI endpoint built before the fork (``check_app()``) does that in each worker."""
    with producer.transaction(sessionmaker(engine)) as txn:
        txn.send("orders", b"a large value", key=b"k")
    [half] = topics.halves()
    omitted = replace(half, message=replace(half.message, value=None))
    check = CheckedTransaction(half.txn_id, CheckBy.LISTENER, 0, omitted, value_omitted=True)
    values = OmittedValues({"bootstrap.servers": kafka_bootstrap}, topics.settings.topics.half)
    # Given a reader the parent has used
    assert values.complete(check).half.message.value == b"a large value"  # type: ignore[union-attr]

    def worker(_: int) -> tuple[object, bool]:
        completed = values.complete(check)
        values.close()
        assert completed.half is not None
        return completed.half.message.value, completed.value_omitted

    # When workers read the value, Then each reads it (before: through the parent's reader,
    # which never answered in the worker, and the value stayed omitted)
    assert in_workers(worker, TWO) == [(b"a large value", False)] * 2
    # and the parent's reader, not closed by them, still reads
    assert values.complete(check).half.message.value == b"a large value"  # type: ignore[union-attr]
    values.close()


class Declined(Exception):
    """The business code's own error: the order is declined."""


# Eight OS processes of its own at once (34 s on the two databases): the processes stage.
# make test keeps the forked workers of every form (test_workers_forked_after_...).
@pytest.mark.integration
@pytest.mark.processes
def test_eight_workers_roll_back_what_raised_and_deliver_the_rest(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
) -> None:
    # Given a producer made before the fork that has sent (its clients are running)
    topic = unique("orders")
    create_topic(kafka_bootstrap, topic, partitions=3)
    factory = sessionmaker(engine)

    def order(order_id: str, declined: bool) -> None:
        with producer.transaction(factory) as txn:
            txn.send(topic, order_id, key=order_id)
            assert txn.session is not None
            txn.session.execute(orders.insert().values(id=order_id, amount=1))
            if declined:
                raise Declined(order_id)

    master = f"master-{uuid.uuid4().hex[:6]}"
    order(master, declined=False)

    def worker(i: int) -> list[str]:
        engine.dispose(close=False)
        placed = [f"kept-{i}-{uuid.uuid4().hex[:6]}", f"declined-{i}-{uuid.uuid4().hex[:6]}"]
        order(placed[0], declined=False)
        with contextlib.suppress(Declined):
            order(placed[1], declined=True)
        return placed

    # When eight workers at once each place an order and have another declined (raised inside)
    reported = in_workers(worker, [os.fork] * 8)
    assert all(isinstance(r, list) for r in reported), reported
    kept = {r[0] for r in reported} | {master}  # type: ignore[index]
    declined = {r[1] for r in reported}  # type: ignore[index]
    # Then what raised is rolled back by each worker itself, the rest delivered once
    with checker_and_relay(kafka_bootstrap, topics.settings.topic_prefix) as checker:
        delivered = Pipeline(kafka_bootstrap, topic, topics, checker).settle(lambda: kept)
    assert delivered == dict.fromkeys(kept, 1)
    assert set(order_ids(engine)) & (kept | declined) == kept
    sent = {h.message.value.decode(): h.txn_id for h in topics.halves()}
    by_producer = {
        op.txn_id: op.state.value for op in topics.ops() if op.decided_by is DecidedBy.PRODUCER
    }
    assert {i: by_producer.get(sent[i]) for i in declined} == dict.fromkeys(declined, "ROLLBACK")


class SlowOrderListener(OrderListener):
    """A local transaction that outlasts the checker's first checks; its check answers as most
    listeners do: ROLLBACK when the row is not there."""

    absent = LocalTransactionState.ROLLBACK

    def __init__(self, engine: sa.Engine, seconds: float) -> None:
        super().__init__(engine)
        self.seconds = seconds

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        time.sleep(self.seconds)  # a slow payment provider: checks come meanwhile
        return super().execute_local_transaction(msg, arg)


@pytest.mark.integration
def test_a_slow_listener_transaction_in_a_forked_worker_is_not_rolled_back_by_the_masters_check(
    kafka_bootstrap: str, producer: OutboxProducer, engine: sa.Engine, topics: Topics
) -> None:
    """Before, the master (whose thread alone serves the checks) did not know the worker was
    still running the transaction: it asked its listener, found no row and answered ROLLBACK;
    the worker then committed, and its message was never delivered."""
    # Given a preloading server's master: producer, check endpoint and listener made before
    # the fork
    producer.serve_checks(engine=engine, secret=SECRET)
    listened = TransactionalProducer(producer, SlowOrderListener(engine, 4.0), answer_timeout_s=1)
    order_id = f"slow-{uuid.uuid4().hex[:10]}"
    with pipeline(kafka_bootstrap, topics, check_max=20) as running:

        def worker(_: int) -> tuple[str, str]:
            engine.dispose(close=False)
            message = Message(running.topic, order_id, key=order_id)
            result = listened.send_message_in_transaction(message, arg=order_id)
            return result.transaction_id, result.local_transaction_state.value

        # When a worker runs a transaction whose local work outlasts the first checks
        [reported] = in_workers(worker, [os.fork], timeout=90)
        assert isinstance(reported, tuple), reported
        txn_id, state = reported
        assert state == "COMMIT"
        # Then the master answered those checks UNKNOWN unasked, and the worker's COMMIT decided
        assert running.decided([txn_id]) == {txn_id: "COMMIT"}
        assert running.settle(lambda: {order_id}) == {order_id: 1}
        assert order_id in order_ids(engine)
        assert running.checker.stats.unknown >= 1

"""A worker forked while a thread of its parent held a lock its Kafka clients need
(:mod:`outbox.fork_checks`).

- glibc's ``getaddrinfo`` holds a lock of its own while it asks the kernel for the host's
  address families. Before, that worker's first send made a Kafka client whose connection never
  came, its transaction waited out the send timeout and rolled back with a ``HalfSendError``
  asking whether Kafka was up, and its ``close()`` never returned (found as a flaky fork test:
  its workers were "hung" in ``rd_kafka_destroy``, a broker thread waiting for that lock in
  ``__check_pf``).
- librdkafka's threads seed their random numbers from the process-wide generator of the OpenSSL
  it links, under that generator's lock. Before, the same: the worker's transaction waited out
  the send timeout ("Failed to get metadata: Local: Broker transport failure"; found as a fork
  test failing about one CI run in eight: its broker threads waited for that lock in
  ``rd_jitter``, seen with gdb), and its ``close()`` waited for those threads.

Now it refuses at once, saying why: before each Kafka client it makes, whether it uses the producer
made before the fork (refused at its first send, and in every other form it then tries: the
decorator, the RocketMQ-style listener, the asyncio forms, its check endpoint's start) or makes its
own (refused by the constructor; before, its clients never connected and its ``close()`` never
returned, as did the check endpoint's heartbeat's). The parent here keeps threads looking
``localhost`` up, or starting threads that each draw librdkafka's random bytes once, while it
forks, standing in for its Kafka clients connecting at that instant; about one fork in four lands
inside a lookup, one in a hundred inside a seeding (measured). Workers are forked in rounds until
both kinds were seen. SQLite only: on PostgreSQL at ``localhost`` the stuck worker's database
driver would wait for glibc's lock too, before the outbox is reached; that is the driver's, not the
outbox's, to report.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

import confluent_kafka
import pytest
import sqlalchemy as sa
from confluent_kafka import cimpl
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session, sessionmaker

import outbox
from checker import Checker
from outbox import (
    AsyncTransactionalProducer,
    LocalTransactionState,
    Message,
    OutboxProducer,
    OutboxSettings,
    TransactionalProducer,
)
from outbox.fork_checks import FORK_CHECK_TIMEOUT_S, SEEDS_FROM_OPENSSL
from relay import Relay, RelaySettings
from tests.checker.test_checker import checker_and_relay, checker_settings
from tests.kafka_helpers import create_topic, unique
from tests.outbox.test_asyncio import async_factory
from tests.outbox.test_forking import in_workers
from tests.outbox.test_transactional_producer import Listener
from tests.pipeline import Pipeline
from tests.producer_fixtures import Topics, order_ids, orders


def look_up(stop: threading.Event) -> None:
    """A parent's Kafka client connecting: host names looked up, ``localhost`` here."""
    while not stop.is_set():
        socket.getaddrinfo("localhost", 9092, flags=socket.AI_ADDRCONFIG)


def seed(stop: threading.Event) -> None:
    """A parent's new Kafka client connecting: its new threads each seed their random numbers
    (librdkafka's ``rd_seed``: OpenSSL's ``RAND_priv_bytes``); here, new threads each build a
    SCRAM credential with no salt, for which librdkafka draws the salt the same way."""
    while not stop.is_set():
        thread = threading.Thread(target=_draw)
        thread.start()
        thread.join()


@functools.cache
def _librdkafka() -> tuple[Callable[..., int], Callable[[int], None]]:
    """confluent-kafka's librdkafka, through its extension (a symbol is looked up in what it
    links): its calls that make and free a SCRAM credential."""
    library = ctypes.CDLL(cimpl.__file__, mode=os.RTLD_NOLOAD)
    new = library.rd_kafka_UserScramCredentialUpsertion_new
    new.restype = ctypes.c_void_p
    new.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int32, ctypes.c_char_p]
    new.argtypes += [ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
    destroy = library.rd_kafka_UserScramCredentialAlteration_destroy
    destroy.argtypes, destroy.restype = [ctypes.c_void_p], None
    return new, destroy


def _draw() -> None:
    """A SCRAM-SHA-256 credential for user "parent", password "-", no salt: made and freed."""
    new, destroy = _librdkafka()
    destroy(new(b"parent", 1, 4096, b"-", 1, None, 0))


def every_other_form(
    producer: OutboxProducer, engine: sa.Engine, db_url: str, topic: str, attempted: list[str]
) -> list[tuple[str, str, float]]:
    """In a worker whose first order (the context manager) was refused: each other form a user
    may call with the producer it inherited, and its check endpoint started as an ASGI app's
    lifespan starts it. What each raised (``"TypeName: message"``, or ``"returned"``) and how
    long it took; the orders tried go into ``attempted``."""
    listener = Listener(LocalTransactionState.COMMIT)
    factory = sessionmaker(engine)

    @outbox.transactional(producer=producer, session_factory=factory)
    def place(order_id: str, session: Session = outbox.INJECTED) -> None:
        attempted.append(order_id)
        session.execute(orders.insert().values(id=order_id, amount=1))
        outbox.send(topic, order_id, key=order_id)

    async def place_async(order_id: str) -> None:
        attempted.append(order_id)
        async with async_factory(db_url) as made, producer.transaction(made) as txn:
            assert isinstance(txn.session, AsyncSession)
            await txn.session.execute(orders.insert().values(id=order_id, amount=1))
            await txn.send(topic, order_id, key=order_id)

    async def send_async_listener() -> None:
        sender = AsyncTransactionalProducer(producer, listener)
        await sender.send_message_in_transaction(Message(topic, b"x"), 1)

    async def start_check_app() -> None:
        app = producer.check_app(
            advertise_url="http://127.0.0.1:9/", engine=engine, insecure_local=True
        )
        async with app.running():
            pass

    forms: dict[str, Callable[[], object]] = {
        "decorator": lambda: place(f"decorated-{uuid.uuid4().hex[:6]}"),
        "listener": lambda: TransactionalProducer(producer, listener).send_message_in_transaction(
            Message(topic, b"x"), 1
        ),
        "asyncio": lambda: asyncio.run(place_async(f"async-{uuid.uuid4().hex[:6]}")),
        "asyncio listener": lambda: asyncio.run(send_async_listener()),
        "check app": lambda: asyncio.run(start_check_app()),
    }
    walked = []
    for form, call in forms.items():
        began = time.monotonic()
        try:
            call()
            outcome = "returned"
        except Exception as err:
            outcome = f"{type(err).__name__}: {err}"
        walked.append((form, outcome, time.monotonic() - began))
    if listener.executed:  # refused before the local transaction, or not at all
        walked.append(("listener", f"executed {listener.executed}", 0.0))
    return walked


#: The parent's threads standing in for its Kafka clients, how many of them, and the error a
#: stuck worker raises. Workers are forked four at a time until both kinds were seen: with one
#: fork in four stuck in a lookup, in the first round or two; with one in a hundred or so stuck
#: in a seeding (measured), in about 25 rounds. None in ROUNDS_S would be a different failure.
PARENTS = {
    "name lookup": (look_up, 2, "ForkedDuringNameLookupError"),
    "random seed": (seed, 4, "ForkedDuringRandomSeedError"),
}
#: Before librdkafka 2.13.2 its threads seeded from the time, taking no lock (none to meet).
OLD_SEEDS = pytest.mark.skipif(
    confluent_kafka.libversion()[1] < SEEDS_FROM_OPENSSL, reason="librdkafka seeds from the time"
)
#: How long workers are forked at most (under the test's 600 s timeout).
ROUNDS_S = 360


@pytest.mark.integration
@pytest.mark.processes
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("parent", ["name lookup", pytest.param("random seed", marks=OLD_SEEDS)])
@pytest.mark.parametrize("made", ["before the fork", "in the worker"])
def test_a_worker_forked_with_a_lock_held_refuses_at_once_and_the_others_deliver(
    parent: str,
    made: str,
    kafka_bootstrap: str,
    outbox_settings: OutboxSettings,
    producer: OutboxProducer,
    db_url: str,
    engine: sa.Engine,
    topics: Topics,
) -> None:
    busy, threads, refused_by = PARENTS[parent]
    topic = unique("orders")
    create_topic(kafka_bootstrap, topic, partitions=3)
    factory = sessionmaker(engine)

    def order(producer: OutboxProducer, order_id: str) -> None:
        with producer.transaction(factory) as txn:
            txn.send(topic, order_id, key=order_id)
            assert txn.session is not None
            txn.session.execute(orders.insert().values(id=order_id, amount=1))

    # Given a producer made before the fork that has sent, in a process whose threads are
    # looking host names up, or seeding random numbers, as its workers are forked; each worker
    # uses that producer, or makes its own (Celery's worker_process_init, a master that kept
    # one for itself)
    master = f"master-{uuid.uuid4().hex[:6]}"
    order(producer, master)
    stop = threading.Event()

    def worker(i: int) -> tuple[str, str, float, float, list[tuple[str, str, float]], list[str]]:
        engine.dispose(close=False)
        order_id = f"worker{i}-{uuid.uuid4().hex[:6]}"
        own: OutboxProducer | None = None
        walked: list[tuple[str, str, float]] = []
        attempted: list[str] = []
        began = time.monotonic()
        try:
            own = producer if made == "before the fork" else OutboxProducer(outbox_settings)
            order(own, order_id)
            outcome = "committed"
        except Exception as err:
            outcome = f"{type(err).__name__}: {err}"
        ended = time.monotonic()
        if own is not None and outcome.startswith("ForkedDuring"):
            walked = every_other_form(own, engine, db_url, topic, attempted)
        closing = time.monotonic()
        if own is not None:
            own.close()  # a worker's shutdown hook
        if own is None:  # refused by the constructor: said so
            outcome += " (making the producer)"
        return outcome, order_id, ended - began, time.monotonic() - closing, walked, attempted

    if busy is seed:
        _librdkafka()  # here, not in the threads: a librdkafka without the calls fails the test
    busy_threads = [
        threading.Thread(target=busy, args=(stop,), daemon=True) for _ in range(threads)
    ]
    for thread in busy_threads:
        thread.start()
    reported: list[object] = []
    try:
        # When workers each place an order (forked in rounds until both kinds were seen)
        began = time.monotonic()
        deadline = began + ROUNDS_S
        while time.monotonic() < deadline:
            reported += in_workers(worker, [os.fork] * 4, timeout=30, fork_again_if_stuck=0)
            outcomes = {str(r[0]).split(":")[0] for r in reported if isinstance(r, tuple)}
            if {"committed", refused_by} <= outcomes or not all(
                isinstance(r, tuple) for r in reported
            ):
                break
    finally:
        stop.set()
        for thread in busy_threads:
            thread.join()
    # Then each worker either committed or was refused at once, saying why: making its own
    # producer, or in every form it called with the inherited one, and starting its check
    # endpoint; none hung, and each closed its producer at once (before: "hung", in the send or
    # the heartbeat and then in close())
    assert all(isinstance(r, tuple) for r in reported), [
        r for r in reported if not isinstance(r, tuple)
    ]
    results = [r for r in reported if isinstance(r, tuple)]
    committed = {r[1] for r in results if r[0] == "committed"}
    # (the parent's own clients may still meet the other lock, however rarely)
    refused = {r[1] for r in results if r[0].startswith("ForkedDuring")}
    assert committed | refused == {r[1] for r in results}, reported
    took_s = time.monotonic() - began
    print(f"workers: {len(committed)} committed, {len(refused)} refused ({parent}, {took_s:.0f} s)")
    refused |= {oid for r in results for oid in r[5]}  # the other forms' orders
    assert any(r[0].startswith(refused_by) for r in results), f"none of {len(results)} stuck"
    assert committed, reported
    forms = ["decorator", "listener", "asyncio", "asyncio listener", "check app"]
    for outcome, _, took, closing, walked, _ in results:
        if outcome.startswith("ForkedDuring"):
            assert "forked from process" in outcome and "worker_process_init" in outcome
            assert took < FORK_CHECK_TIMEOUT_S + 3, outcome
            kind = outcome.split(":")[0]
            # refused by the producer's constructor when made in the worker
            assert outcome.endswith(" (making the producer)") == (made == "in the worker")
            if made == "before the fork":
                assert [form for form, _, _ in walked] == forms, walked
                for form, said, form_took in walked:
                    assert said.split(":")[0] == kind and form_took < 3, (form, said, form_took)
        assert closing < 3, (outcome, closing)
    # and the rows are exactly what a read_committed consumer of the topic gets, each once:
    # a refused worker wrote nothing and sent nothing
    with checker_and_relay(kafka_bootstrap, topics.settings.topic_prefix) as checker:
        delivered = Pipeline(kafka_bootstrap, topic, topics, checker).settle(
            lambda: committed | {master}
        )
    assert delivered == dict.fromkeys(committed | {master}, 1)
    assert set(order_ids(engine)) & (committed | refused | {master}) == committed | {master}
    # and every half record a worker sent has its decision
    halves = {h.txn_id for h in topics.halves()}
    decided = {op.txn_id for op in topics.ops()}
    assert halves <= decided


def _never(*args: object, **kwargs: object) -> object:
    """A lookup that never answers: what every lookup is in a process forked during one."""
    threading.Event().wait()
    raise AssertionError("unreachable")


@pytest.mark.integration
@pytest.mark.parametrize("service", ["relay", "checker"])
def test_a_relay_or_checker_forked_with_a_lock_held_exits_for_its_replacement(
    service: str, kafka_bootstrap: str
) -> None:
    prefix = unique("__outbox-test")

    def in_child(_: int) -> tuple[str, float]:
        # Given a service forked from a process that imported outbox, where no lookup answers
        # (this child's own Python lookups, standing in for glibc's lock inherited held)
        socket.getaddrinfo = _never  # type: ignore[assignment]  # this child's only
        began = time.monotonic()
        # When it runs
        try:
            if service == "relay":
                Relay(RelaySettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix)).run()
            else:
                Checker(checker_settings(kafka_bootstrap, prefix)).run()
            outcome = "returned"
        except Exception as err:
            outcome = f"{type(err).__name__}: {err}"
        return outcome, time.monotonic() - began

    [reported] = in_workers(in_child, [os.fork], timeout=30, fork_again_if_stuck=0)
    # Then it raises the refusal once, so that its supervisor replaces the process, instead of
    # starting session after session that each fail the same way (before: "hung", looping)
    assert isinstance(reported, tuple), reported
    outcome, took = reported
    assert outcome.startswith("ForkedDuringNameLookupError:"), outcome
    assert took < FORK_CHECK_TIMEOUT_S + 5, took

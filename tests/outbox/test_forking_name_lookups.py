"""A worker forked while a thread of its parent was looking up a host name
(:func:`outbox.forking.check_name_lookups`).

glibc's ``getaddrinfo`` holds a lock of its own while it asks the kernel for the host's address
families; a process forked at that instant inherits it held, and no thread of its own will ever
release it. The parent's Kafka clients look names up whenever they connect, so a preloading
server's master, or a Celery parent, can fork such a worker. Before, that worker's first send
made a Kafka client whose connection never came, its transaction waited out the send timeout
and rolled back with a ``HalfSendError`` asking whether Kafka was up, and its ``close()`` never
returned (found as a flaky fork test: its workers were "hung" in ``rd_kafka_destroy``, a broker
thread waiting for that lock in ``__check_pf``). Now it refuses at once, saying why.

The parent here keeps threads looking ``localhost`` up while it forks, standing in for its Kafka
clients connecting at that instant; about one fork in four then lands inside a lookup
(measured). Workers are forked in rounds until both kinds were seen. SQLite only: on
PostgreSQL at ``localhost`` the stuck worker's database driver would wait for that lock too,
before the outbox is reached; that is the driver's, not the outbox's, to report.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import sessionmaker

from outbox import OutboxProducer
from outbox.forking import NAME_LOOKUP_TIMEOUT_S
from tests.checker.test_checker import checker_and_relay
from tests.kafka_helpers import create_topic, unique
from tests.outbox.test_forking import in_workers
from tests.pipeline import Pipeline
from tests.producer_fixtures import Topics, order_ids, orders

#: Rounds of four workers at most: with one fork in four stuck, both kinds come in the first
#: round or two; ten rounds without either would be a different failure.
ROUNDS = 10
REFUSED = "ForkedDuringNameLookupError"


@pytest.mark.integration
@pytest.mark.processes
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_worker_forked_during_a_name_lookup_refuses_at_once_and_the_others_deliver(
    kafka_bootstrap: str, producer: OutboxProducer, engine: sa.Engine, topics: Topics
) -> None:
    topic = unique("orders")
    create_topic(kafka_bootstrap, topic, partitions=3)
    factory = sessionmaker(engine)

    def order(order_id: str) -> None:
        with producer.transaction(factory) as txn:
            txn.send(topic, order_id, key=order_id)
            assert txn.session is not None
            txn.session.execute(orders.insert().values(id=order_id, amount=1))

    # Given a producer made before the fork that has sent, in a process whose threads are
    # looking host names up as its workers are forked
    master = f"master-{uuid.uuid4().hex[:6]}"
    order(master)
    stop = threading.Event()

    def look_up() -> None:
        while not stop.is_set():
            socket.getaddrinfo("localhost", 9092, flags=socket.AI_ADDRCONFIG)

    def worker(i: int) -> tuple[str, str, float, float]:
        engine.dispose(close=False)
        order_id = f"worker{i}-{uuid.uuid4().hex[:6]}"
        began = time.monotonic()
        try:
            order(order_id)
            outcome = "committed"
        except Exception as err:
            outcome = f"{type(err).__name__}: {err}"
        ended = time.monotonic()
        producer.close()  # a worker's shutdown hook
        return outcome, order_id, ended - began, time.monotonic() - ended

    lookups = [threading.Thread(target=look_up, daemon=True) for _ in range(2)]
    for thread in lookups:
        thread.start()
    reported: list[object] = []
    try:
        # When workers each place an order (forked in rounds until both kinds were seen)
        for _ in range(ROUNDS):
            reported += in_workers(worker, [os.fork] * 4, timeout=30, fork_again_if_stuck=0)
            outcomes = {str(r[0]).split(":")[0] for r in reported if isinstance(r, tuple)}
            if {"committed", REFUSED} <= outcomes:
                break
    finally:
        stop.set()
        for thread in lookups:
            thread.join()
    # Then each worker either committed or was refused at once, saying why; none hung, and
    # each closed its producer at once (before: "hung", in the send and then in close())
    assert all(isinstance(r, tuple) for r in reported), reported
    results = [r for r in reported if isinstance(r, tuple)]
    committed = {oid for outcome, oid, _, _ in results if outcome == "committed"}
    refused = {oid for outcome, oid, _, _ in results if outcome.startswith(REFUSED)}
    print(f"workers: {len(committed)} committed, {len(refused)} refused (forked in a lookup)")
    assert committed and refused, reported
    assert committed | refused == {oid for _, oid, _, _ in results}, reported
    for outcome, _, took, closing in results:
        if outcome.startswith(REFUSED):
            assert "forked from process" in outcome and "worker_process_init" in outcome
            assert took < NAME_LOOKUP_TIMEOUT_S + 3, outcome
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

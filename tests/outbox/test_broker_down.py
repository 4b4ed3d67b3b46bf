"""A broker that acknowledges late or never: no COMMIT before every half record is acknowledged.

Where the evidence row goes in while the half records travel (PostgreSQL), a synchronous
``outbox.send()`` returns once its records are handed to Kafka and the code after it runs
meanwhile; the COMMIT waits for the acknowledgement, and a send that is never acknowledged fails
the transaction there. On SQLite the send itself waits, so the code after it runs only once the
records are acknowledged. Brokers of the tests' own: stopping or pausing one disturbs nobody else.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import sessionmaker

import outbox
from outbox import OutboxProducer, OutboxSettings, ensure_topics
from outbox.protocol.states import OpState
from outbox.testing import HarnessSettings, RunningService
from outbox.testing.kafka_process import KafkaProcess
from outbox.testing.stopping import freeze, thaw
from tests.kafka_helpers import unique
from tests.outbox.test_unknown_offset import delivered_once
from tests.producer_fixtures import Topics, evidence_ids, order_ids, orders

pytestmark = [pytest.mark.integration, pytest.mark.processes]


def settings_for(broker: RunningService, *, send_attempts: int) -> OutboxSettings:
    """A producer's settings on ``broker`` (its topics made), giving up on a send after 2 s."""
    settings = OutboxSettings(
        bootstrap_servers=broker.address,
        producer_group="orders",
        partitions=2,
        send_timeout_s=2,
        send_attempts=send_attempts,
    )
    ensure_topics(settings)
    return settings


def test_a_half_send_never_acknowledged_commits_nothing(
    doomed_kafka: RunningService, session_factory: sessionmaker, engine: sa.Engine, db_url: str
) -> None:
    settings = settings_for(doomed_kafka, send_attempts=2)
    order_id = f"order-{uuid.uuid4().hex[:12]}"
    calls: list[str] = []
    with OutboxProducer(settings) as producer:
        assert producer.partitions == 2  # the producer knew the broker before it went away

        @outbox.transactional(producer=producer, session_factory=session_factory)
        def place(*, session: Any) -> None:
            calls.append(outbox.current_transaction().txn_id)
            outbox.send("orders", b"x", key=order_id)
            calls.append("the code after the send ran")
            session.execute(orders.insert().values(id=order_id, amount=1))

        # Given the broker is stopped
        doomed_kafka.stop()
        # When a transaction tries to send its half message
        with pytest.raises(outbox.HalfSendError, match=r"not acknowledged|refused|timed out"):
            place()
    # Then on SQLite the code after the send did not run; on PostgreSQL it ran while the record
    # travelled, and the COMMIT refused to go without the acknowledgement
    txn_id = calls[0]
    if db_url.startswith("sqlite"):
        assert calls == [txn_id]
    else:
        assert calls == [txn_id, "the code after the send ran"]
    # And nothing committed: the DB proves it
    assert order_id not in order_ids(engine)
    assert txn_id not in evidence_ids(engine)


PAUSE_S = 3.0


@contextmanager
def pausable_broker(harness_settings: HarnessSettings, workdir: Path) -> Iterator[KafkaProcess]:
    """A broker process of the test's own, which :func:`paused` can freeze."""
    broker = KafkaProcess(harness_settings, workdir=workdir)
    broker.format()
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def late_settings(broker: KafkaProcess) -> OutboxSettings:
    """Settings that wait out a paused broker (30 s per send) and for the op's acknowledgement,
    on fresh topics."""
    settings = OutboxSettings(
        bootstrap_servers=broker.bootstrap,
        producer_group="orders",
        topic_prefix=unique("__outbox-late"),
        partitions=2,
        send_timeout_s=30,
        wait_for_op=True,
    )
    ensure_topics(settings)
    return settings


@contextmanager
def paused(broker: KafkaProcess, pause_s: float = PAUSE_S) -> Iterator[float]:
    """The broker stops answering (SIGSTOP: connections stay open) for ``pause_s``; yields
    when it was paused. On leaving, waits until it answers again."""
    assert broker.proc is not None
    freeze(broker.proc.pid)  # every thread stopped, not only signalled
    at = time.monotonic()
    resume = threading.Timer(pause_s, thaw, (broker.proc.pid,))
    resume.start()
    try:
        yield at
    finally:
        resume.join()
        thaw(broker.proc.pid)


@contextmanager
def commits_of(target: Any) -> Iterator[list[float]]:
    """When each session of ``target`` (a sessionmaker, or a Session class: an
    ``async_sessionmaker``'s ``sync_session_class``) committed."""
    commits: list[float] = []

    def committed(session: Any) -> None:
        commits.append(time.monotonic())

    sa.event.listen(target, "after_commit", committed)
    try:
        yield commits
    finally:
        sa.event.remove(target, "after_commit", committed)


def assert_held_until_acknowledged(
    events: list[tuple[str, float]],
    commits: list[float],
    paused_at: float,
    returned: float,
    send_waits: bool,
) -> None:
    """The database committed, and the call returned, only after the broker answered; where
    the send itself waits (``send_waits``: SQLite, and asyncio everywhere) the code after it
    ran only then, elsewhere it ran while the record travelled. ``events``: the warm-up's two,
    then the paused transaction's "after the send" and "written, acknowledged: ..."."""
    assert commits[-1] - paused_at >= PAUSE_S - 0.1, (commits, paused_at)
    assert returned - paused_at >= PAUSE_S - 0.1, events
    after_send = events[2][1] - paused_at
    if send_waits:
        assert after_send >= PAUSE_S - 0.1, events
        assert events[3][0] == "written, acknowledged: True", events
    else:
        assert after_send < PAUSE_S / 2, events
        assert events[3][0] == "written, acknowledged: False", events


def assert_committed_and_delivered_once(
    broker: KafkaProcess,
    settings: OutboxSettings,
    engine: sa.Engine,
    topic: str,
    order_id: str,
    txn_id: str,
) -> None:
    """The order and its evidence row committed, the COMMIT op names the half record, and a
    ``read_committed`` consumer of the real topic gets the message once."""
    assert order_id in order_ids(engine)
    assert evidence_ids(engine).get(txn_id) == "evidence"
    topics = Topics(broker.bootstrap, settings)
    [half] = [h for h in topics.halves() if h.txn_id == txn_id]
    [op] = [o for o in topics.ops() if o.txn_id == txn_id]
    assert op.state is OpState.COMMIT and op.half_offsets == (half.offset,), op
    values = delivered_once(broker.bootstrap, settings.topic_prefix, topic, txn_id, count=1)
    assert values == [order_id.encode()]


def test_a_late_acknowledgement_holds_the_commit_until_it_comes(
    harness_settings: HarnessSettings,
    tmp_path: Path,
    session_factory: sessionmaker,
    engine: sa.Engine,
    db_url: str,
) -> None:
    with pausable_broker(harness_settings, tmp_path) as broker:
        settings = late_settings(broker)
        topic = unique("orders")
        order_id = f"order-{uuid.uuid4().hex[:12]}"
        events: list[tuple[str, float]] = []
        with (
            commits_of(session_factory) as commits,
            OutboxProducer(settings) as producer,
        ):

            @outbox.transactional(producer=producer, session_factory=session_factory)
            def place(to: str, value: str, *, session: Any) -> str:
                txn = outbox.current_transaction()
                outbox.send(to, value, key=order_id)
                events.append(("after the send", time.monotonic()))
                session.execute(orders.insert().values(id=value, amount=1))
                events.append((f"written, acknowledged: {txn.settled}", time.monotonic()))
                return txn.txn_id

            place(unique("warm-up"), order_id + "-warm")  # the producer has its producer id
            # Given a broker that stops answering for a while
            with paused(broker) as paused_at:
                # When a transaction sends and writes meanwhile
                txn_id = place(topic, order_id)
                returned = time.monotonic()
        # Then the database committed, and the call returned, only after the broker answered
        assert_held_until_acknowledged(
            events, commits, paused_at, returned, send_waits=db_url.startswith("sqlite")
        )
        # And everything committed, the COMMIT op names the half record, delivered once
        assert_committed_and_delivered_once(broker, settings, engine, topic, order_id, txn_id)


def test_code_raising_while_its_send_travels_to_a_stopped_broker_gets_its_own_error_back(
    doomed_kafka: RunningService, session_factory: sessionmaker, engine: sa.Engine, db_url: str
) -> None:
    """The ROLLBACK waits for the attempt under way (its op would name the records), bounded by
    ``send_timeout_s``, then the caller's own exception comes out; nothing commits."""
    if db_url.startswith("sqlite"):
        pytest.skip("SQLite's send waits for the acknowledgement: the code never raises first")
    settings = settings_for(doomed_kafka, send_attempts=3)
    order_id = f"order-{uuid.uuid4().hex[:12]}"
    with OutboxProducer(settings) as producer:
        assert producer.partitions == 2

        @outbox.transactional(producer=producer, session_factory=session_factory)
        def place(*, session: Any) -> None:
            outbox.send("orders", b"x", key=order_id)
            session.execute(orders.insert().values(id=order_id, amount=1))
            raise LookupError("no such customer")

        # Given the broker is stopped
        doomed_kafka.stop()
        # When the code raises while its send travels
        started = time.monotonic()
        with pytest.raises(LookupError):
            place()
        took = time.monotonic() - started
    # Then the caller's exception came once the attempt under way failed (2-3 s), and nothing
    # committed
    assert took < 5, took  # librdkafka times a record out within a second of its timeout
    assert order_id not in order_ids(engine)

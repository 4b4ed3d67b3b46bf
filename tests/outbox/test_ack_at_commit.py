"""A synchronous ``outbox.send()`` hands its records to Kafka and returns; the code after it runs
while they travel, and the COMMIT waits for their acknowledgement.

Where the database locks rows (PostgreSQL) the evidence row goes in while the half records
travel, so nothing else needs the acknowledgement before the COMMIT: the caller's own writes
overlap Kafka's round trip too. On SQLite, whose one write lock would be held for that round
trip, ``outbox.send()`` still waits before it returns. Either way no COMMIT happens before every
half record of the transaction is acknowledged, a later send waits for the one before it (a
batch's indexes follow those acknowledged), and a ROLLBACK op names records still travelling
when the code raised. (A broker that acknowledges late or never: tests/outbox/test_broker_down.py.)
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

import outbox
from outbox import OutboxProducer, OutboxSettings
from outbox.protocol.states import OpState
from tests.kafka_helpers import set_topic_config, unique
from tests.outbox.test_unknown_offset import delivered_once
from tests.producer_fixtures import Topics, evidence_ids, order_ids, orders

pytestmark = pytest.mark.integration


@contextmanager
def state_at_commit(factory: sessionmaker[Session]) -> Iterator[list[tuple[bool, tuple[int, ...]]]]:
    """At each COMMIT of ``factory``'s sessions: whether the current outbox transaction's sends
    were all acknowledged, and the half offsets it knew then."""
    seen: list[tuple[bool, tuple[int, ...]]] = []

    def before_commit(session: Session) -> None:
        txn = outbox.current_transaction()
        coordinates = txn.coordinates
        seen.append((txn.settled, () if coordinates is None else coordinates.offsets))

    sa.event.listen(factory, "before_commit", before_commit)
    try:
        yield seen
    finally:
        sa.event.remove(factory, "before_commit", before_commit)


def test_the_commit_waits_for_every_half_record_sent(
    producer: OutboxProducer,
    engine: sa.Engine,
    session_factory: sessionmaker[Session],
    db_url: str,
    topics: Topics,
    outbox_settings: OutboxSettings,
) -> None:
    sqlite = db_url.startswith("sqlite")
    order_id = f"order-{uuid.uuid4().hex[:12]}"
    topic = unique("orders")
    settled_after_send: list[bool] = []
    # When a transaction sends two messages, each followed by its own writes
    with state_at_commit(session_factory) as at_commit:

        @outbox.transactional(producer=producer, session_factory=session_factory)
        def place(*, session: Session) -> str:
            txn = outbox.current_transaction()
            outbox.send(topic, f"{order_id}/0", key=order_id)
            settled_after_send.append(txn.settled)
            session.execute(orders.insert().values(id=order_id, amount=1))
            outbox.send(topic, f"{order_id}/1", key=order_id)
            session.execute(orders.insert().values(id=order_id + "-b", amount=2))
            return txn.txn_id

        txn_id = place()
    # Then SQLite's send waited for the acknowledgement (a write lock is not held for it), and
    # PostgreSQL's returned before it
    assert settled_after_send == [sqlite]
    # And the COMMIT came once both half records were acknowledged, naming both
    assert len(at_commit) == 1, at_commit
    [(settled, offsets)] = at_commit
    assert settled and len(offsets) == 2, at_commit
    [op] = [o for o in topics.ops() if o.txn_id == txn_id]
    assert op.state is OpState.COMMIT and op.half_offsets == offsets, op
    halves = {h.offset: h for h in topics.halves() if h.txn_id == txn_id}
    assert [halves[o].index for o in offsets] == [0, 1]
    assert evidence_ids(engine).get(txn_id) == "evidence"
    assert {order_id, order_id + "-b"} <= set(order_ids(engine))
    # And a read_committed consumer of the real topic gets both messages, once each
    values = delivered_once(
        outbox_settings.bootstrap_servers, outbox_settings.topic_prefix, topic, txn_id
    )
    assert values == [f"{order_id}/0".encode(), f"{order_id}/1".encode()]


def test_a_send_says_where_its_records_are_when_asked(
    producer: OutboxProducer, session_factory: sessionmaker[Session], topics: Topics
) -> None:
    order_id = f"order-{uuid.uuid4().hex[:12]}"

    # When the code reads two sends' coordinates, the first one's after the second send
    @outbox.transactional(producer=producer, session_factory=session_factory)
    def place(*, session: Session) -> tuple[str, bool, tuple[int, ...], tuple[int, ...]]:
        txn = outbox.current_transaction()
        first = outbox.send("orders", f"{order_id}/0", key=order_id)
        second = outbox.send("orders", f"{order_id}/1", key=order_id)
        offsets = second.coordinates.offsets
        return txn.txn_id, txn.settled, first.coordinates.offsets, offsets

    txn_id, settled, first, second = place()
    # Then reading them waited for the acknowledgement, and each names its own half records
    # and those before it
    assert settled and len(first) == 1 and len(second) == 2 and second[:1] == first
    halves = {h.offset: h.message.value for h in topics.halves() if h.txn_id == txn_id}
    assert [halves[o] for o in second] == [f"{order_id}/0".encode(), f"{order_id}/1".encode()]


def test_a_rollback_names_records_still_travelling(
    producer: OutboxProducer,
    engine: sa.Engine,
    session_factory: sessionmaker[Session],
    topics: Topics,
) -> None:
    order_id = f"order-{uuid.uuid4().hex[:12]}"
    txn_ids: list[str] = []

    # When the code raises right after a send, before anything waited for it (on PostgreSQL;
    # SQLite's send waited, and the op names the record all the same)
    @outbox.transactional(producer=producer, session_factory=session_factory)
    def place(*, session: Session) -> None:
        txn_ids.append(outbox.current_transaction().txn_id)
        outbox.send("orders", order_id, key=order_id)
        session.execute(orders.insert().values(id=order_id, amount=1))
        raise LookupError("no such customer")

    with pytest.raises(LookupError):
        place()
    [txn_id] = txn_ids
    # Then the ROLLBACK op names the half record (the relay drops it as soon as it reads the
    # op, instead of the checker finding it out later), and nothing committed
    [half] = [h for h in topics.halves() if h.txn_id == txn_id]
    [op] = [o for o in topics.ops() if o.txn_id == txn_id]
    assert op.state is OpState.ROLLBACK and op.half_offsets == (half.offset,), op
    assert order_id not in order_ids(engine)
    assert txn_id not in evidence_ids(engine)


def test_a_send_from_a_session_event_is_acknowledged_before_the_database_commits(
    producer: OutboxProducer,
    engine: sa.Engine,
    session_factory: sessionmaker[Session],
    outbox_settings: OutboxSettings,
    topics: Topics,
) -> None:
    order_id = f"order-{uuid.uuid4().hex[:12]}"
    topic = unique("orders")
    settled_in_event: list[bool] = []

    def before_commit(session: Session) -> None:  # a domain-events pattern: send at commit
        if not settled_in_event:
            outbox.send(topic, f"{order_id}/1", key=order_id)
            settled_in_event.append(outbox.current_transaction().settled)

    # When a transaction sends, and a session event sends again as the COMMIT begins
    sa.event.listen(session_factory, "before_commit", before_commit)
    try:

        @outbox.transactional(producer=producer, session_factory=session_factory)
        def place(*, session: Session) -> str:
            outbox.send(topic, f"{order_id}/0", key=order_id)
            session.execute(orders.insert().values(id=order_id, amount=1))
            return outbox.current_transaction().txn_id

        txn_id = place()
    finally:
        sa.event.remove(session_factory, "before_commit", before_commit)
    # Then the event's send returned acknowledged (the database commits right after it)
    assert settled_in_event == [True]
    # And the COMMIT op names both records, and both are delivered once
    [op] = [o for o in topics.ops() if o.txn_id == txn_id]
    assert op.state is OpState.COMMIT and len(op.half_offsets) == 2, op
    values = delivered_once(
        outbox_settings.bootstrap_servers, outbox_settings.topic_prefix, topic, txn_id
    )
    assert values == [f"{order_id}/0".encode(), f"{order_id}/1".encode()]
    assert order_id in order_ids(engine)


def test_a_refused_send_raises_at_every_read_of_where_it_is_and_nothing_commits(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    engine: sa.Engine,
    session_factory: sessionmaker[Session],
    topics: Topics,
    db_url: str,
) -> None:
    if db_url.startswith("sqlite"):
        pytest.skip("SQLite's send waits for the answer: the refusal is raised by outbox.send()")
    set_topic_config(kafka_bootstrap, topics.settings.topics.half, "max.message.bytes", "2048")
    order_id = f"order-{uuid.uuid4().hex[:12]}"
    reads: list[str] = []

    # When the code reads a refused send's coordinates twice, catching the error each time
    @outbox.transactional(producer=producer, session_factory=session_factory)
    def place(*, session: Session) -> None:
        sending = outbox.send("orders", "x" * 5000, key=order_id)  # over max.message.bytes
        for _ in range(2):
            try:
                reads.append(repr(sending.coordinates))
            except outbox.HalfSendError as err:
                reads.append(type(err).__name__)
        session.execute(orders.insert().values(id=order_id, amount=1))

    # Then each read raised, and the transaction refused to commit
    with pytest.raises(outbox.HalfSendError, match="cannot commit"):
        place()
    assert reads == ["HalfSendError", "HalfSendError"]
    assert order_id not in order_ids(engine)


def test_the_context_manager_and_a_nested_transaction_wait_at_the_outer_commit(
    producer: OutboxProducer,
    engine: sa.Engine,
    session_factory: sessionmaker[Session],
    outbox_settings: OutboxSettings,
    topics: Topics,
    db_url: str,
) -> None:
    order_id = f"order-{uuid.uuid4().hex[:12]}"
    topic = unique("orders")

    @outbox.transactional(producer=producer)
    def inner(*, session: Session) -> bool:  # joins the enclosing transaction
        outbox.send(topic, f"{order_id}/1", key=order_id)
        return outbox.current_transaction().settled

    # When a `with` block sends, then calls a decorated function that sends in the same
    # transaction, and writes
    with (
        state_at_commit(session_factory) as at_commit,
        producer.transaction(session_factory) as txn,
    ):
        outbox.send(topic, f"{order_id}/0", key=order_id)
        settled_after_inner = inner(session=txn.session)
        assert txn.session is not None
        txn.session.execute(orders.insert().values(id=order_id, amount=1))
        txn_id = txn.txn_id
    # Then the inner send was left travelling on PostgreSQL (the inner function commits
    # nothing), and the outer COMMIT came with both acknowledged
    assert settled_after_inner is db_url.startswith("sqlite")
    [(settled, offsets)] = at_commit
    assert settled and len(offsets) == 2, at_commit
    [op] = [o for o in topics.ops() if o.txn_id == txn_id]
    assert op.state is OpState.COMMIT and op.half_offsets == offsets, op
    assert order_id in order_ids(engine)
    values = delivered_once(
        outbox_settings.bootstrap_servers, outbox_settings.topic_prefix, topic, txn_id
    )
    assert values == [f"{order_id}/0".encode(), f"{order_id}/1".encode()]

"""A relay whose host's clock is 10 minutes ahead puts back on the broker's time.

The relay puts a pending transaction's records back at the end of the half topic once they are
``put_back_after_s`` old, measured against the records' broker stamps. On a host 10 minutes
ahead, measured with its own clock, every pending transaction was due as soon as it was read,
and so were its copies (stamped afresh, read back, "10 minutes old" again): a copy of every
undecided transaction at every batch, and the half topic growing for as long as any stayed
undecided. The relay runs as ``python -m relay`` under the shim of tests/clock_fixtures.py,
which moves only that process's wall clock.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

import outbox
from checker import Checker
from outbox import OutboxProducer
from tests.checker.test_checker import SECRET, Background, checker_settings, wait_for
from tests.clock_fixtures import skewed_env
from tests.kafka_helpers import create_topic, unique
from tests.pipeline import ops_lost
from tests.producer_fixtures import Topics, order_ids, orders
from tests.relay.harness import RelayProcess
from tests.relay.test_relay import read_topic

pytestmark = [pytest.mark.integration, pytest.mark.processes]

#: The relay's put-back age (s), and how long the undecided transaction is left with it: three
#: put-backs' worth, so that put-back is seen working, at its pace.
PUT_BACK_AFTER_S = 5
UNDECIDED_S = 15


def test_a_relay_whose_clock_is_ten_minutes_ahead_puts_back_at_the_brokers_pace(
    kafka_bootstrap: str,
    producer: OutboxProducer,
    session_factory: sessionmaker,
    engine: sa.Engine,
    topics: Topics,
    skewed_clock: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prefix = topics.settings.topic_prefix
    topic = unique("orders")
    create_topic(kafka_bootstrap, topic, partitions=3)
    relay = RelayProcess(
        kafka_bootstrap,
        prefix,
        unique("relay"),
        "ahead",
        tmp_path,
        put_back_after_s=PUT_BACK_AFTER_S,
    )
    relay.env |= skewed_env(skewed_clock)
    relay.start()
    try:
        wait_for(relay.holds_partitions, 60)
        # Given a committed transaction whose op was lost, and no checker yet: it stays pending
        order_id = f"order-{uuid.uuid4().hex[:8]}"

        @outbox.transactional(producer=producer, session_factory=session_factory)
        def place(*, session: Session) -> str:
            outbox.send(topic, order_id, key=order_id)
            session.execute(orders.insert().values(id=order_id, amount=1))
            return outbox.current_transaction().txn_id

        with ops_lost(producer, monkeypatch):
            txn_id = place()
        # When the relay ahead has it pending for three put-back ages
        time.sleep(UNDECIDED_S)
        # Then it was put back about every PUT_BACK_AFTER_S of the broker's time, not at every
        # batch: the record and up to one copy per put-back age (a copy before the first age,
        # which a clock ahead made due at once, would make it more)
        copies = [h.offset for h in topics.halves() if h.txn_id == txn_id]
        most = 1 + UNDECIDED_S // PUT_BACK_AFTER_S
        assert 2 <= len(copies) <= most, f"{len(copies)} records of {txn_id} on the half topic"
        # And once a checker decides it, a read_committed reader gets it once
        producer.serve_checks(engine=engine, secret=SECRET)
        # (in this process, on the right clock: only the relay's host is ahead)
        checker = Background(Checker(checker_settings(kafka_bootstrap, prefix)))
        try:
            wait_for(lambda: bool(read_topic(kafka_bootstrap, topic)), 60)
            time.sleep(2)  # a repeat would have come by now
            assert [m.value() for m in read_topic(kafka_bootstrap, topic)] == [order_id.encode()]
            assert order_id in order_ids(engine)
        finally:
            checker.stop()
    finally:
        relay.stop()

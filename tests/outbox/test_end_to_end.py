"""Producer, database and relay together: a read_committed consumer sees exactly the commits."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import sessionmaker

from outbox import OutboxProducer, OutboxSettings
from outbox.protocol import Header
from relay import Relay, RelaySettings
from tests.kafka_helpers import unique
from tests.producer_fixtures import order_ids, orders
from tests.relay.test_relay import read_topic

pytestmark = pytest.mark.integration


class Declined(Exception):
    pass


def test_multi_message_transactions_are_delivered_all_or_nothing(
    kafka_bootstrap: str,
    outbox_settings: OutboxSettings,
    producer: OutboxProducer,
    session_factory: sessionmaker,
    engine: sa.Engine,
) -> None:
    topic = unique("shipments")
    relay = Relay(
        RelaySettings(
            bootstrap_servers=kafka_bootstrap,
            topic_prefix=outbox_settings.topic_prefix,
            group_id=unique("relay"),
            auto_create_topics=True,
        )
    )
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    committed: dict[str, str] = {}
    declined: set[str] = set()
    try:
        for i in range(60):
            order_id = f"order-{uuid.uuid4().hex[:10]}"
            try:
                with producer.transaction(session_factory) as txn:
                    assert txn.session is not None
                    txn.session.execute(orders.insert().values(id=order_id, amount=i))
                    for part in range(3):
                        txn.send(topic, f"{order_id}/{part}", key=order_id)
                    if i % 4 == 0:
                        raise Declined
                committed[txn.txn_id] = order_id
            except Declined:
                declined.add(txn.txn_id)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if len(read_topic(kafka_bootstrap, topic)) >= 3 * len(committed):
                break
            time.sleep(0.5)
        time.sleep(1)
    finally:
        relay.close()
        thread.join(30)

    per_txn: Counter[str] = Counter()
    for msg in read_topic(kafka_bootstrap, topic):
        per_txn[dict(msg.headers())[Header.TXN_ID].decode()] += 1
    assert per_txn == Counter({txn_id: 3 for txn_id in committed})
    assert not set(per_txn) & declined
    stored = set(order_ids(engine))
    assert set(committed.values()) <= stored
    assert len(declined) == 15

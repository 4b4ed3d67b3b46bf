"""The producer run as a principal a cluster's ACLs limit (tests/acl_kafka.py: Kafka's own
``StandardAuthorizer``, SASL PLAIN).

A producer writes three internal topics: the half and op topics, which its transactions feel
at once (a half record refused is a transaction refused), and the registry, which they never
do. Kafka refusing its heartbeats (an ACL list written from what the transactions need) left the
check endpoint serving and nothing logged - while the checker, finding no live instance of the
group, gave up its undecided transactions after ``no_producer_timeout_s``: a committed one
dead-lettered instead of delivered. Now the endpoint does not start, saying which ACL to grant,
and an ACL taken away later is logged and counted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
import time
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka.admin import AclOperation, ResourceType  # type: ignore[attr-defined]
from prometheus_client import CollectorRegistry

from outbox import ConfigurationError, HalfSendError, OutboxProducer, OutboxSettings
from outbox.metrics import producer_metrics
from outbox.protocol.registry import decode_registration
from outbox.registry import Heartbeat
from outbox.testing.ports import free_port
from tests.acl_kafka import AclKafka
from tests.checker.test_checker import SECRET
from tests.checker.test_permissions import fresh_topics
from tests.kafka_helpers import read_to_end
from tests.outbox.forms import refused_in_every_other_form
from tests.producer_fixtures import Topics, order_ids, orders

pytestmark = pytest.mark.integration

PRODUCER = "producer"
REAL_TOPIC = "orders"


def grant_the_producer(broker: AclKafka, settings: OutboxSettings, *, registry: bool) -> None:
    """What the README ("Kafka permissions") asks for the producer's principal, the registry
    aside unless ``registry`` (Describe only then, as a list written from what transactions
    need might give)."""
    names = settings.topics
    for topic in (names.half, names.op, *((names.registry,) if registry else ())):
        broker.allow(PRODUCER, ResourceType.TOPIC, topic, AclOperation.WRITE, AclOperation.DESCRIBE)
    if not registry:
        broker.allow(PRODUCER, ResourceType.TOPIC, names.registry, AclOperation.DESCRIBE)


def as_the_producer(broker: AclKafka, settings: OutboxSettings) -> OutboxSettings:
    return dataclasses.replace(
        settings, bootstrap_servers=broker.sasl, kafka=broker.librdkafka_login(PRODUCER)
    )


def place(producer: OutboxProducer, session_factory: Any, order: str) -> str:
    with producer.transaction(session_factory) as txn:
        txn.send(REAL_TOPIC, order.encode(), key=order)
        assert txn.session is not None
        txn.session.execute(orders.insert().values(id=order, amount=1))
    return txn.txn_id


def registered(broker: AclKafka, settings: OutboxSettings) -> set[str]:
    """The instance ids the registry holds a live registration of (read as the super user)."""
    live: dict[str, bool] = {}
    for m in read_to_end(broker.plain, settings.topics.registry, range(settings.partitions)):
        live[m.key().decode()] = decode_registration(m.value()) is not None
    return {key for key, alive in live.items() if alive}


def test_a_producer_granted_what_the_readme_lists_commits_and_is_found_by_its_heartbeat(
    acl_broker: AclKafka, engine: sa.Engine, session_factory: Any
) -> None:
    settings = fresh_topics(acl_broker, "__outbox-acl-producer")
    grant_the_producer(acl_broker, settings, registry=True)
    metrics = CollectorRegistry()
    with OutboxProducer(as_the_producer(acl_broker, settings), metrics_registry=metrics) as p:
        p.serve_checks(engine=engine, secret=SECRET)
        txn_id = place(p, session_factory, "acl-order-1")
        assert registered(acl_broker, settings), "no heartbeat in the registry"
    topics = Topics(acl_broker.plain, settings)
    assert [h.txn_id for h in topics.halves()] == [txn_id]
    assert [(o.txn_id, o.state.value) for o in topics.ops()] == [(txn_id, "COMMIT")]
    assert "acl-order-1" in order_ids(engine)
    [family] = [f for f in metrics.collect() if f.name == "outbox_producer_heartbeats_failed"]
    assert [s for s in family.samples if s.name.endswith("_total")] == []


def test_a_producer_that_may_not_write_the_half_topic_commits_nothing(
    acl_broker: AclKafka, engine: sa.Engine, session_factory: Any
) -> None:
    """The half topic refused: the transaction fails before its local part runs."""
    settings = fresh_topics(acl_broker, "__outbox-acl-producer")
    names = settings.topics
    acl_broker.allow(PRODUCER, ResourceType.TOPIC, names.half, AclOperation.DESCRIBE)
    acl_broker.allow(PRODUCER, ResourceType.TOPIC, names.op, AclOperation.WRITE)
    with (
        OutboxProducer(as_the_producer(acl_broker, settings)) as p,
        pytest.raises(HalfSendError, match="Write and Describe") as refused,
    ):
        place(p, session_factory, "acl-order-2")
    assert names.half in str(refused.value)
    assert "acl-order-2" not in order_ids(engine)
    assert Topics(acl_broker.plain, settings).halves() == []


def test_a_producer_that_may_not_write_the_op_topic_commits_and_says_which_acl_is_missing(
    acl_broker: AclKafka,
    engine: sa.Engine,
    session_factory: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The op topic refused: the transaction committed (its half records were taken); its op
    is logged as not written, for the checker to decide."""
    settings = fresh_topics(acl_broker, "__outbox-acl-producer")
    names = settings.topics
    acl_broker.allow(PRODUCER, ResourceType.TOPIC, names.half, AclOperation.WRITE)
    acl_broker.allow(PRODUCER, ResourceType.TOPIC, names.half, AclOperation.DESCRIBE)
    acl_broker.allow(PRODUCER, ResourceType.TOPIC, names.op, AclOperation.DESCRIBE)
    waited = dataclasses.replace(as_the_producer(acl_broker, settings), wait_for_op=True)
    with caplog.at_level(logging.WARNING, logger="outbox"), OutboxProducer(waited) as p:
        txn_id = place(p, session_factory, "acl-order-3")
    assert "acl-order-3" in order_ids(engine)
    topics = Topics(acl_broker.plain, settings)
    assert [h.txn_id for h in topics.halves()] == [txn_id]
    assert topics.ops() == []
    said = [r.getMessage() for r in caplog.records if txn_id in r.getMessage()]
    assert any(names.op in m and "Write and Describe" in m for m in said), said


def test_a_registry_the_producer_may_not_write_stops_its_check_endpoint_from_starting(
    acl_broker: AclKafka, engine: sa.Engine, session_factory: Any
) -> None:
    settings = fresh_topics(acl_broker, "__outbox-acl-producer")
    grant_the_producer(acl_broker, settings, registry=False)
    registry = settings.topics.registry
    port = free_port()
    with OutboxProducer(as_the_producer(acl_broker, settings)) as p:
        with pytest.raises(ConfigurationError, match="Write and Describe") as refused:
            p.serve_checks(engine=engine, secret=SECRET, port=port)
        assert registry in str(refused.value)
        assert "no_producer_timeout_s" in str(refused.value)
        with pytest.raises(ConnectionRefusedError):  # the endpoint it had opened is closed
            socket.create_connection(("127.0.0.1", port), timeout=5).close()

        async def lifespan_start() -> None:
            app = p.check_app(advertise_url="http://orders:8000", engine=engine, secret=SECRET)
            async with app.running():
                pass  # pragma: no cover - refused before

        with pytest.raises(ConfigurationError, match=registry):
            asyncio.run(lifespan_start())


def test_an_acl_taken_away_from_a_running_heartbeat_is_logged_counted_and_its_end_logged(
    acl_broker: AclKafka, caplog: pytest.LogCaptureFixture
) -> None:
    settings = fresh_topics(acl_broker, "__outbox-acl-producer")
    grant_the_producer(acl_broker, settings, registry=True)
    registry = settings.topics.registry
    metrics_registry = CollectorRegistry()
    metrics = producer_metrics(settings.producer_group, metrics_registry)

    def failures() -> float:
        found = metrics_registry.get_sample_value(
            "outbox_producer_heartbeats_failed_total",
            {"group": settings.producer_group, "reason": "TOPIC_AUTHORIZATION_FAILED"},
        )
        return found or 0.0

    heartbeat = Heartbeat(
        as_the_producer(acl_broker, settings),
        "http://orders:8000",
        version="test",
        interval_s=0.2,
        metrics=metrics,
    )
    try:
        with caplog.at_level(logging.INFO, logger="outbox"):
            acl_broker.revoke(PRODUCER, ResourceType.TOPIC, registry, AclOperation.WRITE)
            deadline = time.monotonic() + 30
            while failures() < 3 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert failures() >= 3
            errors = [r for r in caplog.records if r.levelno == logging.ERROR]
            assert len(errors) == 1, "one error per cause, not one per heartbeat"
            said = errors[0].getMessage()
            assert registry in said and "Write and Describe" in said
            acl_broker.allow(PRODUCER, ResourceType.TOPIC, registry, AclOperation.WRITE)
            deadline = time.monotonic() + 30
            while heartbeat.failing is not None and time.monotonic() < deadline:
                time.sleep(0.2)
            assert heartbeat.failing is None
            assert any(
                "again" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO
            )
    finally:
        heartbeat.close()


def test_every_other_form_refused_by_the_half_topic_commits_nothing(
    acl_broker: AclKafka, engine: sa.Engine, session_factory: Any, db_url: str
) -> None:
    """The decorator, ``TransactionalProducer`` and both asyncio forms, as the context manager
    above: ``HalfSendError`` naming the ACL, no row, no half record, no listener called."""
    settings = fresh_topics(acl_broker, "__outbox-acl-producer")
    names = settings.topics
    acl_broker.allow(PRODUCER, ResourceType.TOPIC, names.half, AclOperation.DESCRIBE)
    acl_broker.allow(PRODUCER, ResourceType.TOPIC, names.op, AclOperation.WRITE)
    limited = as_the_producer(acl_broker, settings)
    attempted: list[str] = []
    keys = [b"k1", b"k2", b"k3", b"k4"]
    with OutboxProducer(limited) as p:
        refused_in_every_other_form(
            p,
            limited,
            session_factory,
            db_url,
            REAL_TOPIC,
            keys,
            attempted,
            HalfSendError,
            match="Write and Describe",
        )
    assert attempted and not set(attempted) & set(order_ids(engine))
    assert Topics(acl_broker.plain, settings).halves() == []

"""The relay run as a principal a cluster's ACLs limit (tests/acl_kafka.py: Kafka's own
``StandardAuthorizer``, SASL PLAIN).

The ACLs docs/relay.md asks for the relay's principal are granted on the outbox's topics; the
real topics are granted one by one, as a platform team does. A real topic the relay may not
write to must cost nothing but that topic's transactions waiting: nothing lost, nothing
delivered twice, the other topics' transactions flowing, and a log line that says what to grant.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pytest
from confluent_kafka.admin import AclOperation, ResourceType  # type: ignore[attr-defined]

from outbox.protocol import OpState
from relay import RelaySettings
from tests.acl_kafka import AclKafka
from tests.kafka_helpers import create_topic, unique
from tests.relay.harness import wait_for
from tests.relay.test_relay import RelayThread, Stream, delivered, expected, read_topic

pytestmark = pytest.mark.integration

RELAY = "relay"
#: The relay's readiness once a Kafka transaction of its session committed (3 partitions).
COMMITTING = "assigned partitions [0, 1, 2]; committing"
#: What the relay's principal needs on each of its own topics.
INTERNAL_TOPIC_OPERATIONS = (AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE)


def grant_the_relay(broker: AclKafka, stream: Stream, *, group: bool = True) -> None:
    """What docs/relay.md asks for the relay's principal ("Real topics that do not exist or
    refuse writes"); Read on every group unless not ``group``."""
    prefix = f"{stream.settings.topic_prefix}-"
    broker.allow(
        RELAY,
        ResourceType.TOPIC,
        prefix,
        AclOperation.READ,
        AclOperation.WRITE,
        AclOperation.DESCRIBE,
    )
    if group:
        broker.allow(RELAY, ResourceType.GROUP, "*", AclOperation.READ)
    broker.allow(
        RELAY, ResourceType.TRANSACTIONAL_ID, "*", AclOperation.WRITE, AclOperation.DESCRIBE
    )
    broker.allow(RELAY, ResourceType.TOPIC, stream.real_topic, AclOperation.WRITE)


def never_ready(relay: RelayThread, seconds: float, until: Callable[[], bool] | None = None) -> str:
    """Sample the relay's readiness every 0.1 s, asserting each not ready, for ``seconds`` or,
    given ``until``, until it is true (failing if it is not within ``seconds``); the last
    reason."""
    deadline = time.monotonic() + seconds
    while True:
        ready, why = relay.relay.ready()
        assert not ready, f"ready ({why}) while refused"
        if until is not None and until():
            return why
        if time.monotonic() > deadline:
            assert until is None, "timed out waiting for the refusal to be said"
            return why
        time.sleep(0.1)


def relay_as_its_principal(broker: AclKafka, stream: Stream) -> RelayThread:
    return RelayThread(
        RelaySettings(
            bootstrap_servers=broker.sasl,
            topic_prefix=stream.settings.topic_prefix,
            group_id=unique("relay"),
            topic_refresh_s=1,
            park_retry_s=1,
            kafka=broker.librdkafka_login(RELAY),
        )
    )


@pytest.mark.parametrize(
    "granted",
    [(), (AclOperation.DESCRIBE,)],
    ids=["no-acl-on-the-topic", "describe-but-not-write"],
)
def test_a_real_topic_the_relay_may_not_write_to_holds_its_transactions_alone_until_granted(
    acl_broker: AclKafka,
    granted: tuple[AclOperation, ...],
    caplog: pytest.LogCaptureFixture,
) -> None:
    stream = Stream(acl_broker.plain, unique("__outbox-acl-relay"))
    locked = unique("locked-orders")
    create_topic(acl_broker.plain, locked, partitions=1)
    grant_the_relay(acl_broker, stream)
    if granted:
        acl_broker.allow(RELAY, ResourceType.TOPIC, locked, *granted)
    caplog.set_level(logging.WARNING, logger="relay")
    relay = relay_as_its_principal(acl_broker, stream)
    try:
        # Given a committed transaction to a topic the relay may not write to, before others
        # to a topic it may, one on the same key
        real = stream.real_topic
        stream.real_topic = locked
        stream.write([(b"same-key", 1, OpState.COMMIT)])
        [held] = list(stream.committed)
        stream.real_topic = real
        del stream.committed[held]
        stream.write([(b"same-key", 1, OpState.COMMIT), (b"other", 2, OpState.COMMIT)])
        # Then the others are promoted, once, and it waits, with nothing of it on its topic
        wait_for(lambda: set(delivered(acl_broker.plain, stream)) >= expected(stream), 60, "them")
        assert set(delivered(acl_broker.plain, stream).values()) == {1}
        assert read_topic(acl_broker.plain, locked) == []
        wait_for(lambda: f"transaction {held} parked" in caplog.text, 30, "its log line")
        line = next(r.getMessage() for r in caplog.records if held in r.getMessage())
        assert locked in line and "grant the relay's principal" in line and "Write" in line
        # When the ACL is granted, it is promoted, once; the others stay once
        others = delivered(acl_broker.plain, stream)
        acl_broker.allow(RELAY, ResourceType.TOPIC, locked, AclOperation.WRITE)
        stream.real_topic, stream.committed = locked, {held: 1}
        wait_for(lambda: set(delivered(acl_broker.plain, stream)) == {(held, 0)}, 60, "it")
        time.sleep(1)
        assert list(delivered(acl_broker.plain, stream).values()) == [1]
        stream.real_topic = real
        assert delivered(acl_broker.plain, stream) == others
        wait_for(lambda: relay.relay.stats()["parked"] == 0, 30, "no parked transaction")
        # parked before any write: no Kafka transaction was refused and redone for it
        assert relay.relay.stats()["aborts"] == 0
    finally:
        relay.stop()


def test_a_relay_whose_principal_may_not_read_its_group_says_what_to_grant(
    acl_broker: AclKafka, caplog: pytest.LogCaptureFixture
) -> None:
    stream = Stream(acl_broker.plain, unique("__outbox-acl-relay-group"))
    caplog.set_level(logging.WARNING, logger="relay")
    relay: RelayThread | None = None
    try:
        # Given a relay granted all docs/relay.md asks for but Read on its group (another test
        # of the session's broker may have granted every group: taken back, given back after)
        acl_broker.revoke(RELAY, ResourceType.GROUP, "*", AclOperation.READ)
        grant_the_relay(acl_broker, stream, group=False)
        relay = relay_as_its_principal(acl_broker, stream)
        group = relay.relay.settings.group_id
        stream.write([(b"k", 1, OpState.COMMIT)])
        # Then its log says what to grant, and it is never ready meanwhile, its readiness saying
        # the same (readiness holds a rolling update: a ready relay reading nothing let it on)
        grant = f"grant the relay's principal Read on group {group}"
        never_ready(relay, 60, until=lambda: grant in caplog.text)
        assert grant in never_ready(relay, 10)
        # and once granted, it promotes the transaction, once, and is ready
        acl_broker.allow(RELAY, ResourceType.GROUP, group, AclOperation.READ)
        wait_for(lambda: set(delivered(acl_broker.plain, stream)) >= expected(stream), 90, "it")
        assert set(delivered(acl_broker.plain, stream).values()) == {1}
        # (said by the Kafka transaction that promoted it: relay.batch -> GroupReadiness)
        wait_for(lambda: relay.relay.ready() == (True, COMMITTING), 10, "ready, committing")
    finally:
        if relay is not None:
            relay.stop()
        acl_broker.allow(RELAY, ResourceType.GROUP, "*", AclOperation.READ)


@pytest.mark.parametrize(
    "on_half", [(), (AclOperation.DESCRIBE,)], ids=["no-acl-on-half", "describe-but-not-read"]
)
def test_a_relay_whose_principal_may_not_read_the_half_topic_is_not_ready_until_granted(
    acl_broker: AclKafka, caplog: pytest.LogCaptureFixture, on_half: tuple[AclOperation, ...]
) -> None:
    """Without Describe the half topic is left out of the relay's subscription (the group gives
    it the op partitions alone); with Describe alone each fetch of it is refused and each
    session fails at its first Kafka transaction, in a loop."""
    stream = Stream(acl_broker.plain, unique("__outbox-acl-relay-half"))
    names = stream.settings.topics
    caplog.set_level(logging.WARNING, logger="relay")
    # Given a relay granted all docs/relay.md asks for, its own topics one by one, but
    # ``on_half`` on the half topic
    for topic in (names.op, names.state, names.dead_letter):
        acl_broker.allow(RELAY, ResourceType.TOPIC, topic, *INTERNAL_TOPIC_OPERATIONS)
    if on_half:
        acl_broker.allow(RELAY, ResourceType.TOPIC, names.half, *on_half)
    acl_broker.allow(RELAY, ResourceType.GROUP, "*", AclOperation.READ)
    acl_broker.allow(
        RELAY, ResourceType.TRANSACTIONAL_ID, "*", AclOperation.WRITE, AclOperation.DESCRIBE
    )
    acl_broker.allow(RELAY, ResourceType.TOPIC, stream.real_topic, AclOperation.WRITE)
    relay = relay_as_its_principal(acl_broker, stream)
    try:
        stream.write([(b"k", 1, OpState.COMMIT)])
        # Then its log names the half topic's grant, and it is never ready meanwhile
        grant = f"grant the relay's principal Read, Write and Describe on {names.half}"
        never_ready(relay, 60, until=lambda: grant in caplog.text)
        never_ready(relay, 15)
        # and once granted, it sees the half topic within its metadata refresh (10 s, not
        # librdkafka's 5 minutes), promotes the transaction, once, and is ready
        acl_broker.allow(RELAY, ResourceType.TOPIC, names.half, *INTERNAL_TOPIC_OPERATIONS)
        wait_for(lambda: set(delivered(acl_broker.plain, stream)) >= expected(stream), 60, "it")
        assert set(delivered(acl_broker.plain, stream).values()) == {1}
        # (said by the Kafka transaction that promoted it: relay.batch -> GroupReadiness)
        wait_for(lambda: relay.relay.ready() == (True, COMMITTING), 10, "ready, committing")
    finally:
        relay.stop()

"""The relay's readiness of its place in the group (relay/readiness.py), through its seam: the
session's partitions, its consumer's errors and the group's assignment count."""

from __future__ import annotations

import logging
import time

import pytest
from confluent_kafka import KafkaError

from outbox import OutboxSettings
from outbox.consumer_errors import ConsumerErrors
from outbox.service_health import Health
from outbox.topics import ensure_topics
from relay import Relay, RelaySettings
from relay.partitions import Partitions
from relay.readiness import JOINING, SETTLE_S, GroupReadiness
from relay.state import PartitionState
from tests.fake_clock import Clock
from tests.kafka_helpers import unique
from tests.relay.harness import wait_for
from tests.relay.test_relay import RelayThread

GROUP = KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED)
TOPIC = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
GRANT = "grant the relay's principal Read on group rg"
HALF_GRANT = "grant the relay's principal Read, Write and Describe on p-half"


class Member:
    """A session's parts as the loop, the router and the rebalance change them."""

    def __init__(self, after_failure: str | None = None) -> None:
        self.clock = Clock()
        self.health = Health("relay")
        self.partitions = Partitions()
        self.errors = ConsumerErrors("relay", "rg", ("p-half", "p-op"), logging.getLogger("t"))
        self.readiness = GroupReadiness(
            self.health,
            self.partitions,
            self.errors,
            after_failure=after_failure,
            clock=self.clock,
        )
        self.assignments = 0
        self.given_nothing = False

    def assign(self, half: set[int], op: set[int]) -> None:
        """What relay.rebalance does on an assignment: both topics' partitions as given, a
        state for each pair."""
        self.assignments += 1
        self.given_nothing = not half and not op
        self.partitions.assigned = (frozenset(half), frozenset(op))
        self.partitions.states = {p: PartitionState(p) for p in half & op}

    def revoke(self) -> None:
        self.partitions.assigned = (frozenset(), frozenset())
        self.partitions.states = {}

    def turn(self, *errors: KafkaError, topic: str | None = None) -> tuple[bool, str]:
        """One loop turn: the errors read (of ``topic``, if the consumer named one) routed,
        then readiness updated."""
        for error in errors:
            self.errors.report(error, topic)
        self.readiness.update(self.assignments, self.given_nothing)
        return self.health.ready()


@pytest.fixture
def member() -> Member:
    return Member()


def settled(member: Member) -> tuple[bool, str]:
    """A turn once the session has held pairs for SETTLE_S."""
    member.turn()
    member.clock.now += SETTLE_S
    return member.turn()


def test_not_ready_until_the_group_answers(member: Member) -> None:
    assert member.turn() == (False, JOINING)
    member.assign({0, 1, 2}, {0, 1, 2})
    assert settled(member) == (True, "assigned partitions [0, 1, 2]")


def test_joining_says_the_consumers_last_error(member: Member) -> None:
    ready, why = member.turn(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
    assert not ready and why == f"{JOINING}; Broker: Unknown topic or partition"


def test_a_refused_group_holds_readiness_until_the_group_answers(member: Member) -> None:
    # Given the group refused once, before any assignment: not ready, saying what to grant
    ready, why = member.turn(GROUP)
    assert not ready and why.startswith(JOINING) and why.endswith(GRANT)
    # and so it stays, librdkafka saying it no more, whatever else comes
    for _ in range(3):
        ready, why = member.turn(KafkaError(KafkaError._TRANSPORT))
        assert not ready and why.endswith(GRANT)
    # When the group answers with pairs (the grant given): ready
    member.assign({0, 1, 2}, {0, 1, 2})
    assert settled(member) == (True, "assigned partitions [0, 1, 2]")


def test_a_standby_is_ready_once_the_group_answers_even_after_a_refusal(member: Member) -> None:
    member.turn(GROUP)
    member.turn(TOPIC, topic="p-half")
    # When the group, granted, assigns this member nothing (more members than partitions)
    member.assign(set(), set())
    ready, why = member.turn()
    assert ready and "a standby" in why, why


def test_a_refusal_read_in_the_poll_of_the_assignment_counts_as_said_before_it(
    member: Member,
) -> None:
    member.assign(set(), set())
    assert member.turn(GROUP)[0] is True


def test_a_topic_left_out_of_the_subscription_holds_readiness_until_it_is_read(
    member: Member,
) -> None:
    # Given the half topic refused (left out of the subscription), then the op partitions
    # assigned alone
    member.turn(TOPIC, topic="p-half")
    member.assign(set(), {0, 1, 2})
    ready, why = member.turn()
    assert (
        not ready
        and why == f"no partition assigned; Broker: Topic authorization failed; {HALF_GRANT}"
    )
    # When the grant is given and the group assigns both: Describe is proven, not Read
    member.assign({0, 1, 2}, {0, 1, 2})
    ready, why = member.turn()
    assert not ready and why.startswith("assigned partitions [0, 1, 2]; ")
    # and the op topic read to its end says nothing of the half topic
    member.errors.read_to_end("p-op")
    assert member.turn()[0] is False
    # Once a half partition is read to its end: ready
    member.errors.read_to_end("p-half")
    assert settled(member) == (True, "assigned partitions [0, 1, 2]")


def test_a_topic_it_may_describe_but_not_read_is_not_ready_though_assigned(
    member: Member,
) -> None:
    # Given pairs assigned and ready
    member.assign({0, 1, 2}, {0, 1, 2})
    assert settled(member)[0] is True
    # When a fetch of the half topic is refused
    ready, why = member.turn(TOPIC, topic="p-half")
    # Then it is not ready, saying what to grant, until it reads the topic
    assert not ready and why.endswith(HALF_GRANT)
    member.errors.read_to_end("p-half")
    assert member.turn()[0] is True


def test_one_topic_assigned_alone_without_an_error_is_not_ready(member: Member) -> None:
    member.assign(set(), {0, 1, 2})
    ready, why = member.turn()
    assert not ready and "half partitions [], op partitions [0, 1, 2]" in why
    assert "the half topic is not in its subscription" in why
    assert why.endswith("partition counts differ (grow the smaller one)")  # or that


def test_partition_counts_that_differ_leaving_no_pair_say_so(member: Member) -> None:
    # Given the op topic grown alone to 6: another member holds half 0-1 and op 0-2
    member.assign({2}, {3, 4, 5})
    ready, why = member.turn()
    assert not ready and why.endswith("partition counts differ (grow the smaller one)")


def test_partitions_revoked_then_refused_on_rejoining_says_so(member: Member) -> None:
    member.assign({0}, {0})
    assert settled(member)[0] is True
    # When its partitions are revoked, it stays as ready as it was until the next assignment
    member.revoke()
    assert member.turn() == (True, "no partition assigned: rebalancing")
    # and refused on rejoining, not ready
    ready, why = member.turn(GROUP)
    assert (
        not ready and why == f"no partition assigned; Broker: Group authorization failed; {GRANT}"
    )


def test_a_rebalance_while_settling_is_no_standby_and_settles_anew(member: Member) -> None:
    # Given pairs held for 3 s, settling
    member.assign({0, 1, 2}, {0, 1, 2})
    member.turn()
    member.clock.now += 3
    assert member.turn()[0] is False
    # When they are revoked (a rebalance): not taken for a standby
    member.revoke()
    member.clock.now += 3
    assert member.turn()[0] is False
    # and given back, it settles for 5 s again: the 3 s before do not count
    member.assign({0}, {0})
    assert member.turn()[0] is False
    member.clock.now += SETTLE_S
    assert member.turn() == (True, "assigned partitions [0]")


def test_an_assignment_and_a_revoke_in_one_turn_is_no_standby(member: Member) -> None:
    # Given pairs assigned and revoked before the loop turns (one poll served both)
    member.assign({0}, {0})
    member.revoke()
    # Then it is not taken for a standby
    assert member.turn() == (False, "no partition assigned: rebalancing")


def test_a_standby_revoked_stays_a_standby(member: Member) -> None:
    member.assign(set(), set())
    member.turn()
    member.revoke()
    assert member.turn()[1].startswith("no partition assigned: a standby")


def test_an_assignment_of_nothing_is_a_standby(member: Member) -> None:
    member.assign(set(), set())
    assert member.turn() == (
        True,
        "no partition assigned: a standby (more instances than partitions)",
    )


def test_a_session_holds_pairs_for_a_while_before_it_says_ready() -> None:
    """A session that fails at its first Kafka transaction (a topic it may describe, not read)
    must not say ready between its assignment and the failure."""
    member = Member(after_failure="Kafka transaction aborted")
    member.assign({0, 1, 2}, {0, 1, 2})
    ready, why = member.turn()
    assert not ready and why.endswith(
        f"settling for {SETTLE_S:.0f} s after: Kafka transaction aborted"
    )
    member.clock.now += SETTLE_S - 0.1
    assert member.turn()[0] is False
    member.clock.now += 0.1
    assert member.turn() == (True, "assigned partitions [0, 1, 2]")
    # and once settled, a rebalance that brings pairs again does not settle again
    member.revoke()
    member.turn()
    member.assign({0}, {0})
    assert member.turn() == (True, "assigned partitions [0]")


def test_a_commit_while_settling_says_ready_and_settles(member: Member) -> None:
    member.assign({0}, {0})
    assert member.turn()[0] is False
    member.readiness.committed()  # relay.batch, after a Kafka transaction
    assert member.health.ready() == (True, "assigned partitions [0]; committing")
    # and a rebalance that brings pairs again within the 5 s does not settle again
    member.revoke()
    member.turn()
    member.assign({0, 1}, {0, 1})
    assert member.turn() == (True, "assigned partitions [0, 1]; committing")


def test_a_refusal_after_a_commit_says_not_ready(member: Member) -> None:
    member.assign({0}, {0})
    member.readiness.committed()
    ready, why = member.turn(TOPIC, topic="p-half")
    assert not ready and why.endswith(HALF_GRANT)


def test_a_commit_ends_a_refusal_it_proves_wrong(member: Member) -> None:
    # Given the half topic refused, then both topics assigned (its end not reached yet)
    member.turn(TOPIC, topic="p-half")
    member.assign({0}, {0})
    assert member.turn()[0] is False
    # When a Kafka transaction commits both topics' offsets
    member.readiness.committed()
    # Then Kafka took what it refused: ready, and the next turns say so too
    assert member.health.ready() == (True, "assigned partitions [0]; committing")
    assert member.turn() == (True, "assigned partitions [0]; committing")


@pytest.mark.integration
def test_a_relay_started_before_its_topics_exist_is_ready_once_they_are_made(
    kafka_bootstrap: str,
) -> None:
    """A platform team's deploy order: the relay before `kafka-outbox topics ensure`."""
    prefix = unique("__outbox-made-later")
    relay = RelayThread(
        RelaySettings(
            bootstrap_servers=kafka_bootstrap, topic_prefix=prefix, group_id=unique("relay")
        )
    )
    try:
        # Given no topics yet: never ready, and it says which topic is not available
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            ready, why = relay.relay.ready()
            assert not ready, why
            time.sleep(0.1)
        wait_for(lambda: "Subscribed topic not available" in relay.relay.ready()[1], 30, "why")
        ready, why = relay.relay.ready()
        assert not ready and why.startswith(JOINING)
        # When they are made, it joins with both and is ready within its metadata refresh
        settings = OutboxSettings(
            bootstrap_servers=kafka_bootstrap, producer_group="g", topic_prefix=prefix
        )
        ensure_topics(settings)
        wait_for(
            lambda: (lambda r: r[0] and "assigned partitions [" in r[1])(relay.relay.ready()),
            10 + SETTLE_S + 20,
            "ready, holding its partitions",
        )
    finally:
        relay.stop()


def test_a_closed_relay_says_stopped() -> None:
    relay = Relay(RelaySettings(bootstrap_servers="127.0.0.1:1"))
    relay.close()
    relay.run()
    assert relay.ready() == (False, "stopped")

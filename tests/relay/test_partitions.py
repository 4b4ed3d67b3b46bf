"""Relay instances sharing partitions, half and op topics whose partition counts differ, and real
topics that do not exist (yet)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from outbox.protocol import OpState
from relay import RelaySettings
from relay.flow_control import FlowControl
from tests.kafka_helpers import add_partitions, create_topic, set_topic_config, unique
from tests.relay.harness import wait_for
from tests.relay.test_relay import (
    RelayThread,
    Stream,
    delivered,
    expected,
    promotion_order,
    read_topic,
)

pytestmark = pytest.mark.integration


def group_on_fresh_topics(bootstrap: str, prefix: str) -> tuple[Stream, RelaySettings]:
    """Fresh internal topics under ``prefix`` and the settings of a new relay group on them
    (a short session timeout, so a leaving instance's partitions move on quickly). Give each
    instance its own ``instance_id``: two with one ``transactional.id`` fence each other."""
    stream = Stream(bootstrap, unique(prefix))
    settings = RelaySettings(
        bootstrap_servers=bootstrap,
        topic_prefix=stream.settings.topic_prefix,
        group_id=unique("relay"),
        kafka={"session.timeout.ms": 6000},
    )
    return stream, settings


def relay_on(
    stream: Stream, *, flow_control: FlowControl | None = None, **settings: Any
) -> RelayThread:
    """A running relay on ``stream``'s topics, in a group of its own unless ``group_id``."""
    return RelayThread(
        RelaySettings(
            bootstrap_servers=stream.settings.bootstrap_servers,
            topic_prefix=stream.settings.topic_prefix,
            **{"group_id": unique("relay"), **settings},
        ),
        flow_control=flow_control,
    )


def parked_before_others(
    bootstrap: str,
    stream: Stream,
    relay: RelayThread,
    *,
    topic: str | None = None,
    padding: int = 0,
) -> str:
    """One committed transaction (to ``topic``, its value ``padding`` bytes longer) before two
    others to the stream's real topic, one on its key; once the others are promoted and it is
    parked, its id (left out of ``stream.committed``)."""
    real = stream.real_topic
    stream.real_topic, stream.padding = topic or real, padding
    stream.write([(b"same-key", 1, OpState.COMMIT)])
    [parked] = list(stream.committed)
    stream.real_topic, stream.padding = real, 0
    del stream.committed[parked]
    stream.write([(b"same-key", 1, OpState.COMMIT), (b"other", 2, OpState.COMMIT)])
    wait_for(lambda: set(delivered(bootstrap, stream)) >= expected(stream), 60, "others")
    wait_for(lambda: relay.relay.stats()["parked"] == 1, 30, "the parked count")
    return parked


def test_instances_of_one_group_own_the_same_partition_numbers_of_both_topics(
    kafka_bootstrap: str,
) -> None:
    stream, settings = group_on_fresh_topics(kafka_bootstrap, "__outbox-pairs")
    relays = [RelayThread(dataclasses.replace(settings, instance_id=f"r{i}")) for i in range(3)]
    everything = frozenset(range(3))

    def paired(running: list[RelayThread]) -> bool:
        halves = [r.relay.assigned[0] for r in running]
        return all(r.relay.assigned[0] == r.relay.assigned[1] for r in running) and sorted(
            p for h in halves for p in h
        ) == sorted(everything)

    try:
        # Given three instances: each owns one partition number of both topics
        wait_for(
            lambda: paired(relays) and all(len(r.relay.assigned[0]) == 1 for r in relays),
            60,
            "three instances to own one partition number each",
        )
        # When one leaves, the two left take over its number, of both topics again
        relays.pop().stop()
        wait_for(
            lambda: paired(relays) and all(r.relay.assigned[0] for r in relays),
            60,
            "two instances to share both topics",
        )
        # And the pairs promote: a transaction on every partition gets through
        stream.write([(f"k{i}".encode(), 1, OpState.COMMIT) for i in range(12)])
        wait_for(lambda: set(delivered(kafka_bootstrap, stream)) >= expected(stream), 60, "all")
    finally:
        for relay in relays:
            relay.stop()


def test_a_commit_for_a_missing_topic_is_parked_while_others_go_on_and_promoted_once_it_exists(
    kafka_bootstrap: str,
) -> None:
    stream = Stream(kafka_bootstrap, unique("__outbox-park"))
    ghost = unique("not-yet")
    relay = relay_on(stream, topic_refresh_s=1)
    try:
        # Given a committed transaction whose topic does not exist, before others on its key,
        # then the others are promoted and it is parked, with a metric
        parked = parked_before_others(kafka_bootstrap, stream, relay, topic=ghost)
        assert b"outbox_relay_parked_transactions 1.0" in relay.relay.metrics.render()
        # When its topic is created, it is promoted, once
        create_topic(kafka_bootstrap, ghost, partitions=1)
        stream.real_topic = ghost
        stream.committed = {parked: 1}
        wait_for(lambda: set(delivered(kafka_bootstrap, stream)) == {(parked, 0)}, 60, "it")
        time.sleep(1)
        assert list(delivered(kafka_bootstrap, stream).values()) == [1]
        assert relay.relay.stats()["parked"] == 0
    finally:
        relay.stop()


def test_commits_parked_on_a_missing_topic_go_before_later_ones_on_their_keys_once_it_exists(
    kafka_bootstrap: str,
) -> None:
    """Every COMMIT to a missing topic parks, in op order. The batch in which the relay found
    the topic created used to promote the COMMITs it had just read before the parked ones
    (retried after them): later transactions landed before earlier ones on the same key."""
    stream = Stream(kafka_bootstrap, unique("__outbox-park-order"))
    stream.real_topic = ghost = unique("not-yet")
    relay = relay_on(stream, topic_refresh_s=1)
    try:
        stream.write([(b"same-key", 1, OpState.COMMIT) for _ in range(5)])
        wait_for(lambda: relay.relay.stats()["parked"] == 5, 30, "five parked")
        create_topic(kafka_bootstrap, ghost, partitions=1)
        # COMMITs on the same key keep coming while the relay finds the topic created
        until = time.monotonic() + 8
        while time.monotonic() < until:
            stream.write([(b"same-key", 1, OpState.COMMIT)])
        wait_for(lambda: set(delivered(kafka_bootstrap, stream)) == expected(stream), 60, "all")
        order = promotion_order(kafka_bootstrap, ghost)[b"same-key"]
        assert order == stream.commit_order[b"same-key"]
        assert set(delivered(kafka_bootstrap, stream).values()) == {1}
        assert relay.relay.stats()["parked"] == 0
    finally:
        relay.stop()


def test_a_commit_its_real_topic_refuses_is_parked_while_others_go_on_and_retried_until_taken(
    kafka_bootstrap: str,
) -> None:
    stream = Stream(kafka_bootstrap, unique("__outbox-refused"))
    tight = unique("tight")
    create_topic(kafka_bootstrap, tight, partitions=1, config={"max.message.bytes": "2048"})
    relay = relay_on(stream, park_retry_s=2)
    try:
        # Given a committed transaction whose record is bigger than its real topic takes,
        # before others on its key, then the others are promoted and it is parked (each retry
        # is an aborted Kafka transaction), with nothing of it on its topic
        real = stream.real_topic
        refused = parked_before_others(kafka_bootstrap, stream, relay, topic=tight, padding=8000)
        assert relay.relay.stats()["aborts"] >= 1
        assert read_topic(kafka_bootstrap, tight) == []
        # When the topic takes it, the next retry promotes it, once; the others stay once
        others = delivered(kafka_bootstrap, stream)
        set_topic_config(kafka_bootstrap, tight, "max.message.bytes", "1000000")
        stream.real_topic, stream.committed = tight, {refused: 1}
        wait_for(lambda: set(delivered(kafka_bootstrap, stream)) == {(refused, 0)}, 60, "it")
        time.sleep(1)
        assert list(delivered(kafka_bootstrap, stream).values()) == [1]
        assert len(read_topic(kafka_bootstrap, tight)[0].value()) > 8000
        stream.real_topic = real
        assert set(others) == set(delivered(kafka_bootstrap, stream))
        assert set(delivered(kafka_bootstrap, stream).values()) == {1}
        wait_for(lambda: relay.relay.stats()["parked"] == 0, 30, "no parked transaction")
    finally:
        relay.stop()


@pytest.mark.scale  # a record past the size limit (~20 s): the scale stage
def test_transactions_refused_along_with_a_too_big_one_are_retried_apart_and_get_through(
    kafka_bootstrap: str,
) -> None:
    stream = Stream(kafka_bootstrap, unique("__outbox-refused-with"))
    tight = unique("tight")
    create_topic(kafka_bootstrap, tight, partitions=1, config={"max.message.bytes": "2048"})
    # Given a backlog with one transaction too big for its real topic among small ones to the
    # same partition of that topic, which the relay promotes in one Kafka transaction (the
    # broker refuses the record batch as a whole: all of them are reported refused)
    stream.real_topic, stream.padding = tight, 8000
    stream.write([(b"big", 1, OpState.COMMIT)])
    [big] = list(stream.committed)
    del stream.committed[big]
    stream.padding = 0
    stream.write([(f"small-{i}".encode(), 1, OpState.COMMIT) for i in range(4)])
    relay = relay_on(stream, park_retry_s=1)
    try:
        # Then the small ones get through, once, and the big one stays parked
        wait_for(lambda: set(delivered(kafka_bootstrap, stream)) >= expected(stream), 90, "small")
        wait_for(lambda: relay.relay.stats()["parked"] == 1, 30, "the big one parked")
        time.sleep(2)
        seen = delivered(kafka_bootstrap, stream)
        assert set(seen) == expected(stream) and set(seen.values()) == {1}
        assert relay.relay.stats()["aborts"] >= 2  # the batch, then the big one's own retries
        # promotions are counted once committed: the aborted attempts count nothing
        assert relay.relay.totals()["promoted"] == len(seen)
    finally:
        relay.stop()


def test_a_record_too_big_for_the_relays_own_client_is_parked_and_promoted_by_one_that_takes_it(
    kafka_bootstrap: str,
) -> None:
    stream = Stream(kafka_bootstrap, unique("__outbox-too-big"))
    group = unique("relay")
    relay = relay_on(stream, group_id=group, kafka={"message.max.bytes": 5000})
    try:
        # Given a committed transaction with a record bigger than the relay's client sends,
        # before others on its key, then the others are promoted and it is parked, not sent
        big = parked_before_others(kafka_bootstrap, stream, relay, padding=8000)
        assert relay.relay.stats()["aborts"] >= 1
        assert big not in {txn for txn, _ in delivered(kafka_bootstrap, stream)}
    finally:
        relay.stop()
    # When the group's relay restarts with a client that takes it, it is promoted, once
    relay = relay_on(stream, group_id=group)
    try:
        stream.committed[big] = 1
        wait_for(lambda: set(delivered(kafka_bootstrap, stream)) == expected(stream), 60, "it")
        time.sleep(1)
        assert set(delivered(kafka_bootstrap, stream).values()) == {1}
    finally:
        relay.stop()


def test_with_auto_create_a_missing_real_topic_is_created_and_promoted_to(
    kafka_bootstrap: str,
) -> None:
    stream = Stream(kafka_bootstrap, unique("__outbox-autocreate"))
    stream.real_topic = unique("created-by-relay")
    relay = relay_on(stream, auto_create_topics=True, auto_create_partitions=2)
    try:
        stream.write([(b"k", 2, OpState.COMMIT)])
        wait_for(lambda: set(delivered(kafka_bootstrap, stream)) >= expected(stream), 60, "it")
    finally:
        relay.stop()


def test_partitions_given_back_after_a_rebalance_keep_their_state_and_deliver_once(
    kafka_bootstrap: str,
) -> None:
    stream, settings = group_on_fresh_topics(kafka_bootstrap, "__outbox-kept")
    decisions = [OpState.COMMIT, OpState.COMMIT, OpState.COMMIT, OpState.ROLLBACK]
    first = RelayThread(dataclasses.replace(settings, instance_id="first"))
    try:
        # Given one instance that promoted a first stream on all three partitions
        wait_for(lambda: first.relay.assigned[0] == frozenset(range(3)), 60, "all partitions")
        stream.write([(f"k{i}".encode(), 2, decisions[i % 4]) for i in range(30)])
        wait_for(lambda: set(delivered(kafka_bootstrap, stream)) >= expected(stream), 60, "first")
        before = dict(first.relay.states)
        # When a second instance joins and the group shares the partitions out again
        second = RelayThread(dataclasses.replace(settings, instance_id="second"))
        try:
            wait_for(
                lambda: (
                    bool(first.relay.assigned[0])
                    and bool(second.relay.assigned[0])
                    and len(first.relay.assigned[0] | second.relay.assigned[0]) == 3
                    # assigned is set as an assignment begins, the states once it is taken
                    and all(r.relay.states.keys() == r.relay.assigned[0] for r in (first, second))
                ),
                60,
                "the two instances to share the partitions",
            )
            # Then the first keeps the states of the partitions it got back (no rebuild)
            kept = first.relay.assigned[0]
            assert all(first.relay.states[p] is before[p] for p in kept), (kept, before)
            # And everything written afterwards is promoted exactly once
            stream.write([(f"k{i}".encode(), 2, decisions[i % 4]) for i in range(30, 60)])
            wait_for(lambda: set(delivered(kafka_bootstrap, stream)) >= expected(stream), 60, "all")
            counts = delivered(kafka_bootstrap, stream)
            assert set(counts) == expected(stream)
            assert max(counts.values()) == 1, [k for k, n in counts.items() if n > 1]
        finally:
            second.stop()
    finally:
        first.stop()


def unpaired(relay: RelayThread) -> float:
    """The relay's ``outbox_relay_unpaired_partitions``, as a scrape reads it."""
    text = relay.relay.metrics.render().decode()
    for family in text_string_to_metric_families(text):
        if family.name == "outbox_relay_unpaired_partitions":
            return float(family.samples[0].value)
    raise AssertionError("outbox_relay_unpaired_partitions is not exported")


def test_op_partitions_grown_alone_show_as_unpaired_until_the_half_topic_matches(
    kafka_bootstrap: str,
) -> None:
    stream = Stream(kafka_bootstrap, unique("__outbox-unpaired"))
    topics = stream.settings.topics
    # metadata read every second, so the relay sees grown topics at once, not in 5 minutes
    relay = relay_on(stream, kafka={"topic.metadata.refresh.interval.ms": 1000})
    try:
        wait_for(lambda: relay.relay.assigned[0], 60, "the relay's partitions")
        assert unpaired(relay) == 0
        # When an operator grows the op topic alone, the relay holds op 3-5 without a pair,
        # and its metric (which alert OutboxUnpairedPartitions reads) says so
        add_partitions(kafka_bootstrap, topics.op, 6)
        wait_for(lambda: unpaired(relay) == 3, 60, "three unpaired op partitions")
        assert relay.relay.assigned == (frozenset(range(3)), frozenset(range(6)))
        # and the half partitions it still pairs go on being promoted
        stream.write([(f"k{i}".encode(), 1, OpState.COMMIT) for i in range(6)])
        wait_for(lambda: set(delivered(kafka_bootstrap, stream)) >= expected(stream), 60, "all")
        # When the half topic is grown to match, every partition pairs again
        add_partitions(kafka_bootstrap, topics.half, 6)
        wait_for(lambda: unpaired(relay) == 0, 60, "every partition paired")
        assert relay.relay.assigned == (frozenset(range(6)), frozenset(range(6)))
        assert list(delivered(kafka_bootstrap, stream).values()) == [1] * 6
    finally:
        relay.stop()

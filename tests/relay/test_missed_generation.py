"""An instance that missed a generation of its group does not keep a state another member
changed meanwhile.

An instance given back a partition it let go at the revoke just before keeps that partition's
state when the committed progress is still the one it committed (``Rebalance.kept``). Under
librdkafka's eager protocol an instance revoked, then slow to rejoin (a long pause, a starved
CPU), is left out of the next generation with no callback at all; another member holds its
partitions there. That member may promote a parked transaction while an older undecided one
keeps both committed offsets where they were: without a token of each commit in the progress
(:mod:`relay.commit_token`) the progress read back was the same, the slow instance kept its
state, in which the transaction was still parked, and promoted it a second time.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import pytest

from outbox.protocol import OpState
from relay.rebalance import Rebalance
from tests.kafka_helpers import create_topic, unique
from tests.relay.harness import wait_for
from tests.relay.test_partitions import group_on_fresh_topics
from tests.relay.test_relay import RelayThread, delivered

pytestmark = pytest.mark.integration


def test_a_transaction_promoted_in_a_generation_an_instance_missed_is_not_promoted_again(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream, group = group_on_fresh_topics(kafka_bootstrap, "__outbox-missed")
    settings = dataclasses.replace(
        group,
        # the rebalance timeout is max.poll.interval.ms: an instance not back in 7 s is left out
        kafka={**group.kafka, "max.poll.interval.ms": 7000},
        topic_refresh_s=1,
        put_back_after_s=3600,
    )
    ghost = unique("not-yet")
    # Instance "a" pauses in its revoke callback, after letting its partitions go, until the
    # test releases it: long enough for the group to go on without it
    released = threading.Event()
    revoke = Rebalance.on_revoke

    def slow_revoke(self: Rebalance, consumer: Any, partitions: list[Any]) -> None:
        revoke(self, consumer, partitions)
        if self.settings.instance_id == "a" and partitions:
            released.wait(90)

    monkeypatch.setattr(Rebalance, "on_revoke", slow_revoke)
    a = RelayThread(dataclasses.replace(settings, instance_id="a"))
    b: RelayThread | None = None
    try:
        wait_for(lambda: a.relay.assigned[0] == frozenset(range(3)), 60, "a's partitions")
        # Given an undecided transaction, then a committed one on the same key whose topic does
        # not exist yet: "a" parks it, and commits progress held by the undecided one
        stream.write_halves([(b"same-key", 1, OpState.COMMIT)])
        real, stream.real_topic = stream.real_topic, ghost
        stream.write([(b"same-key", 1, OpState.COMMIT)])
        stream.real_topic = real
        [parked] = list(stream.committed)
        wait_for(lambda: a.relay.stats()["parked"] == 1, 60, "a to park it")
        # When a second instance joins, "a" is revoked and stays away past the rebalance
        # timeout: "b" alone holds every partition, and promotes the transaction once its
        # topic exists (an older transaction still pending: the offsets do not move)
        b = RelayThread(dataclasses.replace(settings, instance_id="b"))
        wait_for(lambda: b.relay.assigned[0] == frozenset(range(3)), 60, "b alone")
        create_topic(kafka_bootstrap, ghost, partitions=1)
        stream.real_topic = ghost
        wait_for(lambda: delivered(kafka_bootstrap, stream)[(parked, 0)] == 1, 60, "b's promotion")
        b.stop()
        b = None
        # and "a" comes back, alone, to every partition
        released.set()
        wait_for(lambda: a.relay.assigned[0] == frozenset(range(3)), 60, "a's partitions back")
        wait_for(lambda: a.relay.states.keys() == frozenset(range(3)), 60, "a's states")
        # Then "a" rebuilt the partition instead of keeping its stale state, and the
        # transaction is on its topic once, long after "a" read the topic exists
        time.sleep(5)
        assert a.relay.stats()["parked"] == 0
        assert delivered(kafka_bootstrap, stream)[(parked, 0)] == 1
    finally:
        released.set()
        if b is not None:
            b.stop()
        a.stop()

"""The checker's view of which producer instances are live stays current on a healthy registry.

The view lapses when the registry was not known read to its end for half the TTL
(``tests/checker/test_registry_outage.py``: its partition without a leader). A registry that is
simply quiet - no producer running, or heartbeats further apart than that - must not lapse:
its leader is asked for its end.
"""

from __future__ import annotations

import time

import pytest

from checker.instances import LiveInstances
from outbox import OutboxSettings, ensure_topics
from outbox.registry import Heartbeat
from tests.kafka_helpers import unique

pytestmark = pytest.mark.integration

TTL_S = 4.0  # the view current for 2 s after the registry's end was last known


def test_a_quiet_registry_and_a_heartbeating_one_keep_the_view_current(
    kafka_bootstrap: str,
) -> None:
    settings = OutboxSettings(
        bootstrap_servers=kafka_bootstrap,
        producer_group="orders",
        topic_prefix=unique("__outbox-quiet"),
        partitions=1,
    )
    ensure_topics(settings)
    instances = LiveInstances(
        {"bootstrap.servers": kafka_bootstrap}, settings.topics.registry, TTL_S
    )
    lapses: list[str] = []

    def poll_for(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            instances.poll()
            if instances.unread is not None:
                lapses.append(instances.unread)
            time.sleep(0.05)

    try:
        deadline = time.monotonic() + 30
        while instances.unread is not None and time.monotonic() < deadline:
            instances.poll()
            time.sleep(0.05)
        assert instances.unread is None
        # Given an empty registry, quiet for four times the view's span: still current
        poll_for(4 * instances.currency.current_s)
        assert lapses == []
        # And with an instance heartbeating further apart than that span: still current, and
        # the instance live throughout
        beat = Heartbeat(settings, "http://127.0.0.1:1/check", version="test", interval_s=2.5)
        try:
            deadline = time.monotonic() + 30
            while not instances.live("orders") and time.monotonic() < deadline:
                poll_for(0.1)
            deadline = time.monotonic() + 4 * instances.currency.current_s
            while time.monotonic() < deadline:
                poll_for(0.1)
                assert [r.check_url for r in instances.live("orders")] == [
                    "http://127.0.0.1:1/check"
                ]
        finally:
            beat.close()
        assert lapses == []
    finally:
        instances.close()

"""Closed services let go of their Kafka clients at once: none stays connected to the broker, to
log its refused reconnects once the broker stops (``make demo`` printed a screenful of them after
its verdict: the checker's session, freed only by the cyclic collector, kept its producer and
admin client)."""

from __future__ import annotations

import gc
import os
import re
import threading
import time
import types

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from outbox import OutboxProducer, OutboxSettings, ensure_topics
from outbox.registry import Heartbeat
from outbox.testing import RunningService
from tests.checker.test_checker import checker_and_relay, wait_for
from tests.kafka_helpers import unique

pytestmark = [pytest.mark.integration, pytest.mark.processes]


def connections_to(port: int) -> int:
    """Established TCP connections of this process to ``port`` (Linux: its sockets' inodes in
    /proc/self/fd, matched in /proc/self/net/tcp*)."""
    sockets = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            sockets.add(target[len("socket:[") : -1])
    found = 0
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as rows:
            next(rows)  # the header
            for row in rows:
                fields = row.split()
                remote, state, inode = fields[2], fields[3], fields[9]
                established = state == "01"
                if established and int(remote.rsplit(":", 1)[1], 16) == port and inode in sockets:
                    found += 1
    return found


def _holder(referrer: object) -> str:
    """What holds a client: its type, and for a frame the function and line it stopped at (a
    frame kept by a reference cycle - an exception's traceback - names the code to mend)."""
    if isinstance(referrer, types.FrameType):
        code = referrer.f_code
        return f"frame {code.co_name} ({code.co_filename}:{referrer.f_lineno})"
    return type(referrer).__name__


def still_alive() -> str:
    """The librdkafka clients still alive in this process and what holds each (for a failure
    message: which part did not let go)."""
    scanned = gc.get_objects()
    lines = []
    for obj in scanned:
        if isinstance(obj, (Consumer, Producer, AdminClient)):
            holders = [_holder(r) for r in gc.get_referrers(obj) if r is not scanned]
            lines.append(f"{type(obj).__name__} held by {holders}")
    threads = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    return f"clients alive: {lines}; threads: {threads}"


def test_a_closed_checker_relay_producer_and_heartbeat_leave_no_kafka_connection_open(
    doomed_kafka: RunningService, capfd: pytest.CaptureFixture[str]
) -> None:
    bootstrap = doomed_kafka.address
    port = int(bootstrap.rsplit(":", 1)[1])
    settings = OutboxSettings(
        bootstrap_servers=bootstrap,
        producer_group=unique("orders"),
        topic_prefix=unique("closing"),
        partitions=2,
    )
    ensure_topics(settings)
    # Given the demo's parts running against the broker: a producer, its registry heartbeat, a
    # checker (its session up: partitions assigned and read) and a relay
    producer = OutboxProducer(settings)
    heartbeat = Heartbeat(settings, "http://127.0.0.1:1/", version="test")
    before = set(threading.enumerate())
    with checker_and_relay(bootstrap, settings.topic_prefix) as checker:
        wait_for(lambda: checker.ready()[0])
        assert connections_to(port) > 0
        started = set(threading.enumerate()) - before
    # (their run() returned: a service still running holds its clients)
    assert [t.name for t in started if t.is_alive() and t.name.startswith("background-")] == []
    # When they are closed, as the demo closes them before it stops the broker
    heartbeat.close()
    producer.close()
    # Then none of their clients is connected any more
    deadline = time.monotonic() + 15
    while connections_to(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert connections_to(port) == 0, still_alive()
    # And once the broker stops, nothing of theirs says so on stderr
    doomed_kafka.stop()
    time.sleep(2)
    err = capfd.readouterr().err
    assert [line for line in err.splitlines() if re.match(r"%\d\|", line)] == [], err[-3000:]

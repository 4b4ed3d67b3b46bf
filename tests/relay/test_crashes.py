"""Relays and brokers failing under load, modelled on Apache Kafka's transactions_test.py:
a read_committed consumer, reading concurrently and again at the end, must see every committed
message exactly once, no rolled-back message, and each key's transactions in COMMIT order."""

from __future__ import annotations

import random
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from outbox.protocol import Header
from outbox.testing import HarnessSettings
from outbox.testing.kafka_process import KafkaProcess
from tests.kafka_helpers import unique
from tests.relay.harness import GRACE_S, Load, RelayProcess, Watcher, check_exactly_once, wait_for
from tests.relay.test_relay import read_topic

pytestmark = [pytest.mark.integration, pytest.mark.processes]


def final_read(bootstrap: str, topic: str) -> tuple[Counter[tuple[str, int]], dict]:
    seen: Counter[tuple[str, int]] = Counter()
    per_key: dict[bytes, list[str]] = defaultdict(list)
    where: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    for msg in read_topic(bootstrap, topic):
        headers = dict(msg.headers())
        txn = headers[Header.TXN_ID].decode()
        seen[(txn, int(headers[Header.MESSAGE_INDEX]))] += 1
        where[(txn, int(headers[Header.MESSAGE_INDEX]))].append((msg.partition(), msg.offset()))
        if not per_key[msg.key()] or per_key[msg.key()][-1] != txn:
            per_key[msg.key()].append(txn)
    repeated = {m: w for m, w in where.items() if len(w) > 1}
    assert not repeated, f"{len(repeated)} messages twice in the topic at: {repeated}"
    return seen, per_key


def finish(load: Load, watcher: Watcher, relays: list[RelayProcess], bootstrap: str) -> None:
    """Stop the load, let the relays catch up, then check the concurrent and a final read."""
    load.stop()
    try:
        try:
            wait_for(lambda: set(watcher.seen) >= load.expected(), 240, "every committed message")
        except AssertionError as err:
            raise AssertionError(f"{err}\n{diagnose(load, watcher, relays)}") from err
        time.sleep(2)  # a late duplicate would show up now
    finally:
        for relay in relays:
            relay.stop()
        watcher.stop()
    check_exactly_once(load, *final_read(bootstrap, load.real_topic))  # what the topic holds
    repeated = {m: watcher.where[m] for m, n in watcher.seen.items() if n > 1}
    assert not repeated, f"the concurrent reader saw repeats at (partition, offset): {repeated}"
    check_exactly_once(load, watcher.seen, watcher.per_key)


def diagnose(load: Load, watcher: Watcher, relays: list[RelayProcess]) -> str:
    """Which committed messages are missing, and what the relays say about themselves."""
    missing = load.expected() - set(watcher.seen)
    lines = [
        f"{len(missing)} of {len(load.expected())} committed messages not seen "
        f"(ops re-sent after a failed delivery: {load.resent_ops}); some: {sorted(missing)[:5]}"
    ]
    for relay in relays:
        lines.append(f"--- {relay.name} (stuck exits: {relay.stuck_exits}) metrics ---")
        lines.append(relay.metrics())
        lines.append(f"--- {relay.name} stacks ---\n{relay.stacks()}")
    return "\n".join(lines)


@pytest.fixture
def logs(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    for log in sorted(tmp_path.glob("*.log")):  # shown when a test fails
        print(f"--- {log.name} (tail) ---\n" + "\n".join(log.read_text().splitlines()[-15:]))


@pytest.mark.parametrize("instances", [1, 3])
def test_relays_bounced_hard_and_clean_under_load_deliver_each_committed_message_once(
    kafka_bootstrap: str, logs: Path, instances: int
) -> None:
    rng = random.Random(instances)
    prefix, group = unique("__outbox-crash"), unique("relay")
    load = Load(kafka_bootstrap, prefix).start()
    watcher = Watcher(kafka_bootstrap, load.real_topic)
    relays = [
        RelayProcess(kafka_bootstrap, prefix, group, f"relay-{i}", logs) for i in range(instances)
    ]
    for relay in relays:
        relay.start()
    # Each instance is bounced three times, alternately SIGKILL and SIGTERM, at a random
    # moment after it has been assigned partitions and the output has grown since.
    for round_ in range(3):
        for i, relay in enumerate(rng.sample(relays, len(relays))):
            before = watcher.count()
            wait_for(relay.holds_partitions, 90, f"{relay.name} to be assigned partitions")
            wait_for(lambda b=before: watcher.count() > b + 50, 90, "promotions to progress")
            time.sleep(rng.uniform(0.1, 1.5))
            if (round_ + i) % 2 == 0:
                relay.kill()
            else:
                assert relay.terminate() < GRACE_S + 5
            time.sleep(rng.uniform(0, 1.0))
            relay.start()
    assert load.committed, "the load wrote nothing"
    finish(load, watcher, relays, kafka_bootstrap)


# A broker's restart under load is the pinned broker's check as much as the relay's (it caught
# KAFKA-20734 on 4.3.1: README, "Broker versions"): make test-broker runs it, outside make
# test's 30 minutes.
@pytest.mark.broker_guard
def test_a_broker_restart_during_load_loses_and_repeats_nothing(
    harness_settings: HarnessSettings, logs: Path
) -> None:
    (logs / "broker").mkdir()
    broker = KafkaProcess(harness_settings, workdir=logs / "broker")
    broker.format()
    broker.start()
    try:
        prefix, group = unique("__outbox-restart"), unique("relay")
        load = Load(broker.bootstrap, prefix).start()
        watcher = Watcher(broker.bootstrap, load.real_topic)
        relays = [
            RelayProcess(broker.bootstrap, prefix, group, f"relay-{i}", logs) for i in range(2)
        ]
        for relay in relays:
            relay.supervise()  # librdkafka can hang after a restart; the relay then exits 3
            relay.start()
        wait_for(lambda: watcher.count() > 500, 120, "promotions before the restart")
        # When the broker goes down and comes back while producers and relays keep going
        before_pid = broker.proc.pid if broker.proc else None
        broker.restart()
        assert broker.proc is not None and broker.proc.pid != before_pid
        before = watcher.count()
        try:
            wait_for(lambda: watcher.count() > before + 500, 180, "promotions after the restart")
        except AssertionError as err:
            raise AssertionError(f"{err}\n{diagnose(load, watcher, relays)}") from err
        # Then, once everything is read, each committed message is there exactly once
        finish(load, watcher, relays, broker.bootstrap)
        # And no transaction was parked as refused: a broker restarting refuses no record
        for relay in relays:
            assert "refused a write" not in relay.log.read_text(errors="replace"), relay.tail()
    finally:
        broker.kill()


def test_a_relay_frozen_past_its_session_timeout_is_fenced_when_it_wakes(
    kafka_bootstrap: str, logs: Path
) -> None:
    """A zombie: frozen (SIGSTOP) while it holds partitions, maybe with a Kafka transaction
    open, for longer than its session timeout; the group gives its partitions to the other
    instance. Woken, nothing it had open may be committed: the group generation it sends with
    its offsets is stale, so the broker refuses the transaction."""
    prefix, group = unique("__outbox-zombie"), unique("relay")
    load = Load(kafka_bootstrap, prefix).start()
    watcher = Watcher(kafka_bootstrap, load.real_topic)
    relays = [RelayProcess(kafka_bootstrap, prefix, group, f"relay-{i}", logs) for i in range(2)]
    for relay in relays:
        relay.start()
    frozen = relays[0]
    assert frozen.proc is not None
    for _ in range(2):
        wait_for(frozen.holds_partitions, 90, "the frozen one to be assigned partitions")
        before = watcher.count()
        wait_for(lambda b=before: watcher.count() > b + 50, 90, "promotions to progress")
        frozen.proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(10)  # past the 6 s session timeout: its partitions go to the other
            before = watcher.count()
            wait_for(lambda b=before: watcher.count() > b + 50, 90, "the other to take over")
        finally:
            frozen.proc.send_signal(signal.SIGCONT)
        time.sleep(3)
    assert load.committed, "the load wrote nothing"
    finish(load, watcher, relays, kafka_bootstrap)

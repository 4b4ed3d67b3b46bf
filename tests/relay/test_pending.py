"""Undecided transactions on a real broker: put-back keeps the committed offsets moving, and
the memory cap holds with 100,000 of them."""

from __future__ import annotations

import random
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from outbox import OutboxSettings, ensure_topics
from outbox.protocol import (
    DecidedBy,
    HalfMessage,
    Header,
    OpRecord,
    OpState,
    encode_half_headers,
    encode_op,
    new_transaction_id,
    partition_for,
)
from outbox.protocol.half import decode_half
from outbox.testing.ports import free_port
from relay import RelaySettings
from tests.kafka_helpers import create_topic, set_topic_config, unique
from tests.relay.harness import RelayProcess, wait_for
from tests.relay.test_relay import RelayThread, read_topic

pytestmark = pytest.mark.integration
PARTITIONS = 6


class Halves:
    """Half records written straight to the half topic, their ops written later on demand."""

    def __init__(self, bootstrap: str, prefix: str) -> None:
        self.settings = OutboxSettings(
            bootstrap_servers=bootstrap, producer_group="g", topic_prefix=prefix, partitions=6
        )
        ensure_topics(self.settings)
        self.real_topic = unique("relayed")
        create_topic(bootstrap, self.real_topic, partitions=3)
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True}
        )
        self.where: dict[str, tuple[int, int]] = {}  # txn id -> (partition, offset)

    def write(self, count: int, value_size: int = 100) -> list[str]:
        txns = [new_transaction_id() for _ in range(count)]
        errors: list[object] = []
        for txn in txns:
            key = txn.encode()
            partition = partition_for(key, PARTITIONS)
            message = HalfMessage(self.real_topic, txn.encode().ljust(value_size, b"."), key)

            def delivered(err: object, msg: object, t: str = txn) -> None:
                if err is not None:
                    errors.append(err)
                self.where[t] = (msg.partition(), msg.offset())  # type: ignore[attr-defined]

            while True:
                try:
                    self.producer.produce(
                        self.settings.topics.half,
                        key=key,
                        value=message.value,
                        headers=encode_half_headers(
                            txn_id=txn,
                            producer_group="g",
                            message=message,
                            index=0,
                            count=1,
                            created_at_ms=0,
                        ),
                        partition=partition,
                        on_delivery=delivered,
                    )
                    break
                except BufferError:
                    self.producer.poll(0.1)
        assert self.producer.flush(60) == 0
        assert not errors, errors[:3]
        return txns

    def relay(self, group_id: str, **settings: Any) -> RelayThread:
        """A relay running on these topics."""
        return RelayThread(
            RelaySettings(
                bootstrap_servers=self.settings.bootstrap_servers,
                topic_prefix=self.settings.topic_prefix,
                group_id=group_id,
                **settings,
            )
        )

    def commit(self, txns: list[str]) -> None:
        for txn in txns:
            partition, offset = self.where[txn]
            op = OpRecord(txn, OpState.COMMIT, "g", partition, (offset,), DecidedBy.PRODUCER, 0)
            key, value = encode_op(op)
            self.producer.produce(
                self.settings.topics.op, key=key, value=value, partition=partition
            )
        assert self.producer.flush(60) == 0


def promoted(bootstrap: str, topic: str) -> Counter[str]:
    return Counter(dict(m.headers())[Header.TXN_ID].decode() for m in read_topic(bootstrap, topic))


def committed_offset(bootstrap: str, group: str, topic: str, partition: int) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        return int(consumer.committed([TopicPartition(topic, partition)], 10)[0].offset)
    finally:
        consumer.close()


def copies(bootstrap: str, topic: str, partition: int) -> list:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("copies"),
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    found = []
    try:
        consumer.assign([TopicPartition(topic, partition, 0)])
        while (msg := consumer.poll(10)) is not None and msg.error() is None:
            record = decode_half(value=msg.value(), headers=msg.headers(), offset=msg.offset())
            if record.is_copy:
                found.append(record)
    finally:
        consumer.close()
    return found


def test_a_long_pending_half_is_put_back_and_still_promoted_once_its_commit_arrives(
    kafka_bootstrap: str,
) -> None:
    halves = Halves(kafka_bootstrap, unique("__outbox-putback"))
    group = unique("relay")
    relay = halves.relay(group, put_back_after_s=2)
    try:
        # Given a transaction left undecided, with decided ones after it on its partition
        [pending] = halves.write(1)
        partition, original = halves.where[pending]
        later = [t for t in halves.write(60) if halves.where[t][0] == partition]
        halves.commit(later)
        half_topic = halves.settings.topics.half
        # When it stays undecided past the put-back threshold
        wait_for(
            lambda: any(
                c.txn_id == pending for c in copies(kafka_bootstrap, half_topic, partition)
            ),
            60,
            "a put-back copy",
        )
        # Then a copy naming the original offset is on the half topic, and the relay's
        # committed half offset has moved past the original
        copy = next(
            c for c in copies(kafka_bootstrap, half_topic, partition) if c.txn_id == pending
        )
        assert copy.origin_offset == original and copy.offset > original
        wait_for(
            lambda: committed_offset(kafka_bootstrap, group, half_topic, partition) > original,
            30,
            "the committed half offset to pass the original",
        )
        # And its COMMIT (naming the original offset) still promotes it, once
        halves.commit([pending])
        wait_for(lambda: pending in promoted(kafka_bootstrap, halves.real_topic), 60, "promotion")
        time.sleep(3)  # time for another put-back round: it must not promote again
        seen = promoted(kafka_bootstrap, halves.real_topic)
        assert seen[pending] == 1 and all(seen[t] == 1 for t in later)
    finally:
        relay.stop()


def test_a_pending_half_whose_put_back_copy_is_refused_stays_in_place_and_others_go_on(
    kafka_bootstrap: str,
) -> None:
    """Before, the refused copy failed its batch forever, and every partition of the instance
    waited with it."""
    halves = Halves(kafka_bootstrap, unique("__outbox-stays"))
    half_topic = halves.settings.topics.half
    group = unique("relay")
    # Given an undecided transaction the half topic took, then would not take a copy of
    [big] = halves.write(1, value_size=150_000)
    partition, original = halves.where[big]
    set_topic_config(kafka_bootstrap, half_topic, "max.message.bytes", "100000")
    relay = halves.relay(group, put_back_after_s=1)
    try:
        wait_for(lambda: big in relay.relay.writer.unmovable, 30, "the refused put-back")
        # When others are committed after it, on every partition
        later = halves.write(60)
        halves.commit(later)
        # Then they are delivered, while it stays pending where it was, with no copy
        wait_for(
            lambda: set(promoted(kafka_bootstrap, halves.real_topic)) >= set(later), 60, "others"
        )
        assert not any(c.txn_id == big for c in copies(kafka_bootstrap, half_topic, partition))
        assert committed_offset(kafka_bootstrap, group, half_topic, partition) == original
        assert relay.relay.stats()["pending"] == 1
        # And its COMMIT still promotes it, once
        halves.commit([big])
        wait_for(lambda: big in promoted(kafka_bootstrap, halves.real_topic), 60, "promotion")
        time.sleep(2)
        seen = promoted(kafka_bootstrap, halves.real_topic)
        assert set(seen.values()) == {1} and set(seen) == {big, *later}
    finally:
        relay.stop()


def metrics(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def total(values: dict[str, float], name: str) -> float:
    return sum(v for k, v in values.items() if k.split("{")[0] == name)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.processes
def test_memory_stays_under_the_cap_with_100000_undecided_transactions(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    cap, undecided = 2_000, 100_000
    halves = Halves(kafka_bootstrap, unique("__outbox-memory"))
    txns = halves.write(undecided, value_size=1024)
    port = free_port()
    relay = RelayProcess(
        kafka_bootstrap,
        halves.settings.topic_prefix,
        unique("relay"),
        "memory",
        tmp_path,
        max_held_records=cap,
        http_port=port,
        put_back_after_s=3600,
    )
    relay.start()
    try:
        wait_for(
            lambda: _try(lambda: total(metrics(port), "outbox_relay_pending_records")) == undecided,
            180,
            "the relay to read every undecided half record",
        )
        values = metrics(port)
        held = {k: v for k, v in values.items() if k.startswith("outbox_relay_held_records{")}
        assert len(held) == PARTITIONS and all(v <= cap for v in held.values()), held
        assert relay.proc is not None
        memory = rss_mb(relay.proc.pid)
        print(f"relay RSS with {undecided} undecided transactions, cap {cap}: {memory:.0f} MiB")
        # measured: ~210 MiB with the cap, ~450 MiB with no cap (every value held)
        assert memory < 300, f"{memory:.0f} MiB"
        for probe in ("healthz", "readyz"):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/{probe}", timeout=5) as r:
                assert r.status == 200
        # Commits for evicted (oldest), held (newest) and random ones are all promoted once
        rng = random.Random(1)
        chosen = txns[:100] + txns[-100:] + rng.sample(txns[100:-100], 100)
        halves.commit(chosen)
        wait_for(
            lambda: set(promoted(kafka_bootstrap, halves.real_topic)) >= set(chosen),
            120,
            "the chosen commits",
        )
        seen = promoted(kafka_bootstrap, halves.real_topic)
        assert set(seen) == set(chosen) and set(seen.values()) == {1}
        values = [m.value() for m in read_topic(kafka_bootstrap, halves.real_topic)]
        assert all(v.rstrip(b".").decode() in chosen for v in values)
        assert total(metrics(port), "outbox_relay_pending_records") == undecided - len(chosen)
    finally:
        relay.stop()


def _try(read):  # type: ignore[no-untyped-def]
    try:
        return read()
    except OSError:
        return None

"""Small Kafka helpers for tests: create a topic, read a partition range to the end."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from typing import Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourceType,
)

from outbox.kafka_logging import log_to_python


def admin_client(bootstrap: str) -> AdminClient:
    """An admin client whose librdkafka log goes through Python logging, as the suite's other
    clients' does (tests/logged_clients.py cannot replace ``AdminClient``): left alone, its
    lines, such as ``BGQUEUE ... Purging unserved events`` as it goes, reached the run's output
    past pytest's capture."""
    return AdminClient(log_to_python({"bootstrap.servers": bootstrap}))


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def create_topic(
    bootstrap: str, name: str, *, partitions: int = 1, config: dict[str, str] | None = None
) -> None:
    admin = admin_client(bootstrap)
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})]
    )
    futures[name].result(30)


def remove_up_to_the_end(bootstrap: str, topic: str, partition: int) -> int:
    """What retention does, now: the partition's log start moves to its end."""
    admin = admin_client(bootstrap)
    [future] = admin.delete_records([TopicPartition(topic, partition, -1)]).values()
    return int(future.result(30).low_watermark)


def add_partitions(bootstrap: str, topic: str, total: int, *, timeout: float = 30) -> None:
    """Grow ``topic`` to ``total`` partitions, and return once a broker's metadata has them all."""
    admin = admin_client(bootstrap)
    admin.create_partitions([NewPartitions(topic, total)])[topic].result(timeout)
    deadline = time.monotonic() + timeout
    while len(admin.list_topics(topic, 10).topics[topic].partitions) < total:  # asks a broker
        assert time.monotonic() < deadline, f"{topic} still without {total} partitions"
        time.sleep(0.1)


def set_topic_config(
    bootstrap: str, topic: str, name: str, value: str, *, timeout: float = 30
) -> None:
    """Change one setting of an existing topic (the others are kept), and return once the
    broker has it in force.

    The controller acknowledges the change when it is in the metadata log; the broker applies it
    when it replays that record, a moment later (under load, tens of milliseconds: a record sent
    at once could still meet the old setting). A broker's DescribeConfigs answers from its
    metadata image, which it publishes just before it applies the topic's new configuration to
    the topic's logs (``BrokerMetadataPublisher.publish``), hence the short wait after it reads
    the new value."""
    admin = admin_client(bootstrap)
    entry = ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])
    admin.incremental_alter_configs([resource])[resource].result(timeout)
    described = ConfigResource(ResourceType.TOPIC, topic)
    deadline = time.monotonic() + timeout
    while True:
        entries = admin.describe_configs([described])[described].result(timeout)
        if entries[name].value == value:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"topic {topic}: {name} still {entries[name].value!r}, not {value!r}, "
                f"{timeout} s after the change was acknowledged"
            )
        time.sleep(0.01)
    time.sleep(0.1)


def open_transaction(bootstrap: str, topic: str, partition: int = 0) -> Producer:
    """A Kafka transaction left open on ``topic``'s ``partition``: one record written, neither
    committed nor aborted (a relay's put-back copies before it commits, or a relay that died
    mid-transaction). The caller aborts it with the producer returned."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique("open")})
    producer.init_transactions(30)
    producer.begin_transaction()
    errors: list[object] = []
    producer.produce(
        topic,
        b"in an open transaction",
        b"open",  # a key: compacted topics refuse records without one
        partition=partition,
        on_delivery=lambda err, _msg: errors.append(err),
    )
    assert producer.flush(30) == 0 and errors == [None], errors
    return producer


_SETTLING = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
}


def watermarks(consumer: Consumer, tp: TopicPartition, timeout: float = 30) -> tuple[int, int]:
    """Low and high watermark, retrying while a fresh partition's leader settles in."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=10)
            return int(low), int(high)
        except KafkaException as err:
            settling = err.args[0].code() in _SETTLING or err.args[0].retriable()
            if not settling or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


#: How long the broker may hold a reader's fetch that finds nothing new. A partition's end
#: (EOF) is reported only after such an empty fetch, so Kafka's default (500 ms) made every
#: read of a three-partition topic cost 1.5 s or more of waiting, partition after partition.
READER_FETCH_WAIT_MS = 10


def read_to_end(
    bootstrap: str,
    topic: str,
    partitions: Iterable[int] | None = None,
    *,
    isolation: str = "read_committed",
    timeout: float = 30,
) -> list[Message]:
    """Every record of ``topic`` (or of its ``partitions``) a fresh consumer sees now, in
    partition and offset order.

    Reads each partition to its end (EOF), not to ``high - 1``: on a transactionally written
    topic the last offsets are commit markers, which no consumer ever receives; and read
    committed, a partition ends at its last stable offset. The partitions are read at once.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("reader"),
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": READER_FETCH_WAIT_MS,
        }
    )
    records: list[Message] = []
    try:
        if partitions is None:
            partitions = consumer.list_topics(topic, timeout=timeout).topics[topic].partitions
        starts = []
        for p in partitions:
            low, high = watermarks(consumer, TopicPartition(topic, p), timeout)
            if high > low:
                starts.append(TopicPartition(topic, p, low))
        if not starts:
            return records
        consumer.assign(starts)
        left = {tp.partition for tp in starts}
        deadline = time.monotonic() + timeout
        while left:
            assert time.monotonic() < deadline, f"{topic}{sorted(left)} not read to the end"
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                left.discard(msg.partition())
                continue
            records.append(msg)
    finally:
        consumer.close()
    records.sort(key=lambda m: (m.partition(), m.offset()))
    return records


def read_partition(
    bootstrap: str, topic: str, *, partition: int = 0, isolation: str = "read_committed"
) -> list[bytes]:
    """The values of one partition's records up to its current end (:func:`read_to_end`)."""
    return [m.value() for m in read_to_end(bootstrap, topic, [partition], isolation=isolation)]


class WithoutOffset:
    """A delivery report as librdkafka gives it for a produce it retried and the broker had
    already written (DUPLICATE_SEQUENCE_NUMBER on the retry, after a leader change): delivered,
    offset unknown. One broker does not answer that way on demand, so tests wrap a real
    report in this."""

    def __init__(self, msg: Any) -> None:
        self._msg = msg

    def offset(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._msg, name)


def reported_without_offset(report: Any) -> Any:
    """``report`` (a delivery callback) handed each successful report as :class:`WithoutOffset`."""

    def without_offset(err: Any, msg: Any) -> None:
        report(err, WithoutOffset(msg) if err is None else msg)

    return without_offset

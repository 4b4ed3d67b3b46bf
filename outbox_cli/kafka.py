"""Reaching Kafka from the command line: a fast reachability probe and bounded topic scans.

Every scan is ``read_committed`` (put-back copies and resumes are written transactionally) and
ends at each partition's end as it was when the scan started, so a command always terminates.
librdkafka's own log lines go to Python logging (:mod:`outbox.kafka_logging`), which keeps them
off the terminal unless ``--debug`` is given (:func:`outbox_cli.main.main`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from outbox.kafka_logging import log_to_python
from outbox.topic_metadata import read_topic_metadata
from outbox_cli.errors import CommandError, UnreachableError

#: librdkafka keys that say how to connect; the operator commands keep only these.
CONNECTION_KEYS = ("security.", "sasl.", "ssl.", "socket.", "client.", "broker.", "connections.")


def connection(bootstrap: str, kafka: Mapping[str, Any]) -> dict[str, Any]:
    """Client settings: the bootstrap servers and the connection keys of ``kafka``."""
    extra = {k: v for k, v in kafka.items() if k.startswith(CONNECTION_KEYS)}
    return log_to_python({"bootstrap.servers": bootstrap, **extra})


def probe(config: Mapping[str, Any], timeout: float, variable: str) -> dict[str, int]:
    """Topic name -> partition count, or :class:`UnreachableError` naming the setting to fix."""
    admin = AdminClient(dict(config))
    try:
        metadata = read_topic_metadata(  # a dropped connection: again
            admin, timeout, what=config["bootstrap.servers"]
        )
    except KafkaException as err:
        raise UnreachableError(
            f"cannot reach Kafka at {config['bootstrap.servers']} within {timeout:g} s "
            f"({err.args[0].str()}); check {variable}"
        ) from err
    finally:
        admin.poll(0)  # its librdkafka log (why it was not reached, with --debug) comes out here
    return {
        name: len(topic.partitions)
        for name, topic in metadata.topics.items()
        if topic.error is None
    }


def require(topics: Mapping[str, int], names: Iterable[str]) -> None:
    """Refuse to go on when an internal topic is missing (exit 1, with the fix)."""
    missing = [n for n in names if n not in topics]
    if missing:
        raise CommandError(
            f"topics {', '.join(missing)} do not exist; create them with "
            "`kafka-outbox topics ensure` (or check OUTBOX_TOPIC_PREFIX; on a cluster with ACLs, "
            "a topic these credentials may not describe is left out of Kafka's topic list too: "
            "grant them Describe on it)"
        )


def where(msg: Message) -> tuple[int, int]:
    """A consumed record's partition and offset (never None for a record read from a topic)."""
    return msg.partition() or 0, msg.offset() or 0


class Reader:
    """A throwaway ``read_committed`` consumer that reads partition ranges to their end."""

    def __init__(self, config: Mapping[str, Any], timeout: float) -> None:
        self.timeout = timeout
        self._consumer = Consumer(
            {
                **config,
                "group.id": f"kafka-outbox-cli-{uuid.uuid4().hex[:12]}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
            }
        )

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ends(self, topic: str, partitions: Iterable[int]) -> dict[int, tuple[int, int]]:
        """Log start and end of each partition, the end as this read_committed reader can
        reach it: the last stable offset (the high watermark but for a Kafka transaction still
        open there, whose records the reader cannot read yet)."""
        found = {}
        for p in partitions:
            low, high = self._call(
                lambda p=p: self._consumer.get_watermark_offsets(
                    TopicPartition(topic, p), timeout=self.timeout
                )
            )
            found[p] = (int(low), int(high))
        return found

    def starts(self, topic: str, partitions: Iterable[int], since_ms: int | None) -> dict[int, int]:
        """Where to start reading each partition: its start, or the first record at or after
        ``since_ms`` (its end when there is none)."""
        parts = list(partitions)
        if since_ms is None:
            return {p: low for p, (low, _) in self.ends(topic, parts).items()}
        asked = [TopicPartition(topic, p, max(0, since_ms)) for p in parts]
        found = self._call(lambda: self._consumer.offsets_for_times(asked, timeout=self.timeout))
        ends = self.ends(topic, parts)
        return {
            tp.partition: tp.offset if tp.offset >= 0 else ends[tp.partition][1] for tp in found
        }

    def read(self, topic: str, starts: Mapping[int, int]) -> Iterator[Message]:
        """Every committed record from ``starts`` to the end of each partition, in order."""
        ends = self.ends(topic, starts)
        todo = {p for p, start in starts.items() if start < ends[p][1]}
        if not todo:
            return
        self._consumer.assign([TopicPartition(topic, p, starts[p]) for p in sorted(todo)])
        deadline = time.monotonic() + max(self.timeout * 4, 30)
        try:
            while todo:
                if time.monotonic() > deadline:
                    raise CommandError(
                        f"could not read {topic} partitions {sorted(todo)} to their end in time "
                        "(a Kafka transaction left open?); try again or narrow with --since"
                    )
                for msg in self._consumer.consume(500, 0.5):
                    error = msg.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            todo.discard(msg.partition())
                            continue
                        raise CommandError(f"reading {topic}: {error.str()}")
                    partition, offset = where(msg)
                    end = ends[partition][1]
                    if offset >= end - 1:
                        todo.discard(partition)
                    if offset < end:  # records written since the scan began wait
                        yield msg
        finally:
            self._consumer.unassign()

    def _call(self, fn: Any) -> Any:
        """``fn()``, retried while a partition's leader settles (fresh topics, elections)."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return fn()
            except KafkaException as err:
                error = err.args[0]
                settling = error.code() in _SETTLING or error.retriable()
                if settling and time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                if error.code() in _UNREACHABLE or settling:
                    raise UnreachableError(f"Kafka did not answer in time: {error.str()}") from err
                raise CommandError(f"Kafka refused a read: {error.str()}") from err


_SETTLING = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
}
_UNREACHABLE = {KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN}

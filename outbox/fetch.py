"""Reading half records back by offset (relay and checker): RocketMQ looks a half message up by its
commit-log offset; we do the same with the offsets an op record names.

Needed when the records are not in memory: their values were dropped to stay under the memory
cap, the relay restarted after they were read, or a ``resume`` named copies already read past.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, TopicPartition

from outbox import kafka_clients
from outbox.errors import KafkaOperationError, ProtocolError
from outbox.logs import fields
from outbox.protocol.half import HalfRecord, decode_half

log = logging.getLogger("outbox")

#: Offsets closer than this are read in one sweep instead of one seek each.
SWEEP_GAP = 500


class HalfFetcher:
    """Fetches half records of one topic by partition and offsets."""

    def __init__(self, config: dict[str, Any], topic: str, timeout_s: float = 30.0) -> None:
        self.topic = topic
        self.timeout_s = timeout_s
        self.fetches = 0
        self._consumer = kafka_clients.consumer(
            {
                **config,
                "group.id": "outbox-fetch",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "auto.offset.reset": "error",
                "enable.partition.eof": True,
                # Reads records that exist: no long poll. With the default 500 ms, the fetch
                # left waiting past the records of one lookup held up the first fetch of the
                # next: ~500 ms a lookup (measured, one after another: p50 504 ms), which a
                # relay pays per transaction whose values it dropped under the memory cap.
                "fetch.wait.max.ms": 10,
            }
        )

    def fetch(self, partition: int, offsets: Sequence[int], txn_id: str) -> list[HalfRecord] | None:
        """The decodable records of ``txn_id`` at ``offsets``; None when any is gone.

        Raises:
            KafkaOperationError: the partition could not be read in time (broker trouble); the
                caller retries the whole batch later.
        """
        self.fetches += 1
        wanted = sorted(set(offsets))
        found: dict[int, HalfRecord] = {}
        for run in _runs(wanted):
            got = self._sweep(partition, run[0], run[-1])
            if got is None:
                return None
            found.update({o: r for o, r in got.items() if o in run})
        records = [found[o] for o in wanted if o in found and found[o].txn_id == txn_id]
        if len(records) != len(wanted):
            log.warning(
                "transaction %s: %d of its half records at %s were not found",
                txn_id,
                len(wanted) - len(records),
                wanted,
                extra=fields(txn_id=txn_id, partition=partition, offsets=wanted),
            )
            return None
        return records

    def _sweep(self, partition: int, first: int, last: int) -> dict[int, HalfRecord] | None:
        self._consumer.assign([TopicPartition(self.topic, partition, first)])
        found: dict[int, HalfRecord] = {}
        idle = 0
        try:
            while True:
                msg = self._consumer.poll(1.0)
                if msg is None:
                    idle += 1
                    if idle > self.timeout_s:
                        raise KafkaOperationError(
                            f"half partition {partition}: offsets {first}..{last} not readable"
                        )
                    continue
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        if int(msg.offset() or 0) > last:
                            return found
                        # Below offsets known to exist: a high watermark restored from its
                        # checkpoint after a broker restart, or the last stable offset before
                        # a Kafka transaction still open (a relay's put-back copies). "Not
                        # found" would reject the transaction; wait for the broker instead.
                        idle += 1
                        if idle > self.timeout_s:
                            raise KafkaOperationError(
                                f"half partition {partition} ends at {msg.offset()} for now, "
                                f"below {last}"
                            )
                        time.sleep(0.2)
                        continue
                    if error.code() == KafkaError._AUTO_OFFSET_RESET:
                        low, _ = self._consumer.get_watermark_offsets(
                            TopicPartition(self.topic, partition), timeout=10, cached=False
                        )
                        if first < low:
                            return None  # below the log start: removed by retention
                        # above the end the broker shows now (right after a restart): a
                        # "not found" would reject a transaction whose records exist
                        raise KafkaOperationError(
                            f"half partition {partition}: offset {first} out of range for now "
                            f"({error.str()}); read again later",
                            error,
                        )
                    raise KafkaOperationError(f"half partition {partition}: {error}", error)
                offset = int(msg.offset() or 0)
                if offset > last:
                    return found
                # An undecodable one was dead-lettered when the reader met it: not one of ours.
                with contextlib.suppress(ProtocolError):
                    found[offset] = decode_half(
                        value=msg.value(),
                        headers=msg.headers(),
                        partition=partition,
                        offset=offset,
                        timestamp_ms=msg.timestamp()[1],
                    )
                if offset >= last:
                    return found
        finally:
            self._consumer.unassign()

    def close(self) -> None:
        self._consumer.close()


def _runs(offsets: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for offset in offsets:
        if runs and offset - runs[-1][-1] <= SWEEP_GAP:
            runs[-1].append(offset)
        else:
            runs.append([offset])
    return runs

"""Reading a service's state records back from the state topic (:mod:`outbox.protocol.state`).

A relay or checker writes one record per pending transaction it must remember, in the Kafka
transaction that makes it true, and a tombstone once it need not. On (re)assignment it reads its
partitions of the topic to their ends: compaction keeps about one record per transaction still
remembered (plus recent tombstones), so the read costs what is pending, not history.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import KafkaError, Message, TopicPartition

from outbox import kafka_clients
from outbox.errors import KafkaOperationError, ProtocolError
from outbox.logs import fields
from outbox.protocol.state import StateOwner, StateValue, decode_state
from outbox.protocol.topics import TopicNames
from outbox.watermarks import Watermarks

log = logging.getLogger("outbox.state")

#: Seconds without a record of a partition still to read before the read gives up (a Kafka
#: transaction another relay or checker left open holds the read up to its transaction timeout).
IDLE_LIMIT_S = 30


def read_state(
    config: dict[str, Any],
    names: TopicNames,
    owner: StateOwner,
    group_id: str,
    partitions: Iterable[int],
    *,
    watermarks: Watermarks,
    progress: Callable[[], None] | None = None,
    idle_limit_s: float = IDLE_LIMIT_S,
) -> dict[str, tuple[int, StateValue]]:
    """What ``owner``'s group ``group_id`` remembers for ``partitions``: txn id -> (partition,
    latest value), tombstoned ones left out. ``config`` is the client configuration (bootstrap
    servers, security).

    ``watermarks`` tells where the partitions start and end: a reader of its own is opened only
    when one of them holds a record (it costs a group-less client's start-up, on every
    assignment, which a state topic with nothing to remember need not pay). The end is the high
    watermark: relays and checkers write to the same partitions, each in its own Kafka
    transactions, and records committed after another's transaction still open (a checker
    killed in a round, until its transaction times out) lie past the last stable offset, where
    a read_committed read stops until that transaction ends. The read waits for it rather than
    leave them out (a Parked record or a tombstone missed would repeat or forget a decision).

    ``progress`` is called after each step that may wait (a partition's end offsets) and each
    record or end of a partition still to read, so a service's watchdog takes a long read for
    work, not for a loop stuck in a call: each step is bounded, the read as a whole grows with
    the partitions and what they remember. Each partition is read to the end it had when the
    read began, and at most ``idle_limit_s`` pass without one of them moving on.

    Raises:
        KafkaOperationError: a partition could not be read to its end.
    """
    turned = progress or no_progress
    starts: dict[int, int] = {}
    ends: dict[int, int] = {}
    for p in sorted(set(partitions)):
        low, high = watermarks.query(names.state, p, timeout=10)
        turned()
        if high > low:
            starts[p], ends[p] = low, high
    if not starts:
        return {}
    reader = kafka_clients.consumer(
        {
            **config,
            "group.id": f"{group_id}-state",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    found: dict[str, tuple[int, StateValue]] = {}
    try:
        todo = set(starts)
        reader.assign([TopicPartition(names.state, p, low) for p, low in starts.items()])
        # Only a partition still to read moving on is progress: records other services go on
        # writing to a partition read already must not keep a stuck read alive.
        deadline = time.monotonic() + idle_limit_s
        while todo:
            msg = reader.poll(1.0)
            if msg is not None:
                partition, done = _read(found, msg, names.state, owner, group_id, ends)
                if partition in todo:
                    deadline = time.monotonic() + idle_limit_s
                    turned()
                    if done:
                        todo.discard(partition)
                    continue
            if time.monotonic() > deadline:
                raise KafkaOperationError(
                    f"{names.state} partitions {sorted(todo)} not read to their ends "
                    f"{ {p: ends[p] for p in sorted(todo)} } in {idle_limit_s:g} s: a Kafka "
                    "transaction another relay or checker left open holds them until it "
                    "commits or times out (the read is tried again)"
                )
    finally:
        reader.close()
    return found


def _read(
    found: dict[str, tuple[int, StateValue]],
    msg: Message,
    topic: str,
    owner: StateOwner,
    group_id: str,
    ends: dict[int, int],
) -> tuple[int, bool]:
    """Apply one record (or end-of-partition event); its partition, and whether that partition
    is read to the end it had when the read began (what is written meanwhile is not waited
    for; a transaction's commit marker can be the last offset, hence the event too). An end of
    partition below that end is the last stable offset: a transaction is open there."""
    partition = int(msg.partition() or 0)
    error = msg.error()
    if error is not None:
        if error.code() != KafkaError._PARTITION_EOF:
            raise KafkaOperationError(f"reading {topic}: {error.str()}", error)
        return partition, int(msg.offset() or 0) >= ends.get(partition, 0)
    _apply(found, msg, owner, group_id)
    return partition, int(msg.offset() or 0) >= ends.get(partition, 0) - 1


def no_progress() -> None:
    """The ``progress`` of a caller that has no watchdog to tell."""
    return None


def _apply(
    found: dict[str, tuple[int, StateValue]], msg: Message, owner: StateOwner, group_id: str
) -> None:
    partition = int(msg.partition() or 0)
    try:
        key, value = decode_state(msg.key(), msg.value(), partition=partition)
    except ProtocolError as err:
        log.warning(
            "unreadable state record at %s[%d] offset %s: %s",
            msg.topic(),
            partition,
            msg.offset(),
            err,
            extra=fields(topic=msg.topic(), partition=partition, offset=msg.offset()),
        )
        return
    if key.owner is not owner or key.group != group_id:
        return
    if value is None:
        found.pop(key.txn_id, None)
    else:
        found[key.txn_id] = (partition, value)

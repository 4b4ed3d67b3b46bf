"""``kafka-outbox resume TXN_ID``: put a given-up transaction back to be checked again.

RocketMQ's resume of discarded half messages. In one Kafka transaction (transactional id
``kafka-outbox-resume-<txn id>``, so two resumes of one transaction fence each other):

1. a copy of each dead-lettered message is appended to its half partition: the original half
   headers without the ``outbox-dl-*`` ones, in their own schema version, with check count 0
   and ``outbox-origin-offset`` the original offset;
2. a RESUMED op (not terminal) naming the copies' offsets goes to the op partition;
3. a resume marker (key = the transaction id, null value, ``outbox-dl-resumed``) goes to the
   dead-letter partition, so the same dead letters are never resumed twice.

Its checks run again after the transactional id is initialised, which fences (aborts) any
concurrent resume of the same transaction, so a race cannot append the copies twice.
"""

from __future__ import annotations

import contextlib
import getpass
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from outbox.protocol.copies import copy_headers
from outbox.protocol.dead_letter import DeadLetterHeader
from outbox.protocol.op import OpRecord, encode_op
from outbox.protocol.states import DecidedBy, OpState
from outbox.protocol.topics import TopicNames
from outbox_cli.errors import CommandError, NotFoundError, RefusedError, UnreachableError
from outbox_cli.history import (
    DeadLetter,
    History,
    deciding_op,
    header,
    read_dead_letters,
    read_ops,
)
from outbox_cli.inspect import iso
from outbox_cli.kafka import Reader


@dataclass(frozen=True)
class Resumed:
    """What ``resume`` wrote."""

    txn_id: str
    partition: int
    copies: tuple[int, ...]
    sources: tuple[int, ...]
    op_offset: int
    marker_offset: int


def plan(
    reader: Reader, names: TopicNames, partitions: int, txn_id: str, slack_s: float
) -> tuple[History, list[DeadLetter]]:
    """The transaction and the dead letters to put back, or why it cannot be resumed.

    Raises:
        NotFoundError: no op at all for the transaction (exit 4), or no dead letters.
        RefusedError: its state is not GIVEN_UP, or a resume marker follows its dead letters.
    """
    history = History(txn_id)
    since = history.created_ms - int(slack_s * 1000)
    history.ops, history.tombstones = read_ops(reader, names, txn_id, partitions, since)
    if not history.ops:
        raise NotFoundError(
            f"unknown transaction {txn_id}: no op record on {names.op} since {iso(since)} "
            "(only a transaction the checker gave up can be resumed; widen with --slack)"
        )
    state = history.state
    if state is not OpState.GIVEN_UP:
        raise RefusedError(
            f"transaction {txn_id} is {state.value if state else 'undecided'}, not GIVEN_UP; "
            "only a given-up transaction can be resumed"
        )
    partition = history.ops[-1].half_partition  # every op of a transaction is on one partition
    history.dead_letters, history.markers = read_dead_letters(
        reader, names, txn_id, partition, since
    )
    letters = history.pending_dead_letters()
    if not letters:
        if history.markers:
            last = history.markers[-1]
            raise RefusedError(
                f"transaction {txn_id} was already resumed at {iso(last.resumed_at_ms)} "
                f"(marker at {names.dead_letter}[{partition}]@{last.offset})"
            )
        raise NotFoundError(
            f"transaction {txn_id} is GIVEN_UP but has no dead letters in "
            f"{names.dead_letter}[{partition}] since {iso(since)}; nothing to put back"
        )
    omitted = [
        letter
        for letter in letters
        if header(letter.headers, DeadLetterHeader.OMITTED.value) is not None
    ]
    if omitted:
        # Put back as it is, the copy would carry no value: the relay would deliver a null (on
        # a compacted topic, deleting the key) in place of the message.
        letter = omitted[0]
        why = header(letter.headers, DeadLetterHeader.OMITTED.value)
        raise RefusedError(
            f"transaction {txn_id}: the dead letter at {names.dead_letter}[{partition}]@"
            f"{letter.offset} holds no value ({why}); put back, its copy would deliver a "
            "null in place of the message. Put "
            f"{names.half}[{partition}]@{letter.source_offset} back by hand, and raise the "
            "dead-letter topic's max.message.bytes for later dead letters"
        )
    unreadable = [letter for letter in letters if letter.half is None]
    if unreadable:
        raise RefusedError(
            f"transaction {txn_id}: the dead letter at {names.dead_letter}[{partition}]@"
            f"{unreadable[0].offset} does not hold a readable half record (its outbox headers "
            "are missing or of an unknown schema version); upgrade kafka-outbox, or put the "
            "record back by hand"
        )
    return history, letters


def resume(
    config: Mapping[str, Any],
    reader: Reader,
    names: TopicNames,
    partitions: int,
    txn_id: str,
    *,
    slack_s: float,
    timeout: float,
) -> Resumed:
    """Check, then put the transaction back in one Kafka transaction (see the module doc)."""
    plan(reader, names, partitions, txn_id, slack_s)  # fail fast, before touching the broker
    producer = Producer(
        {**config, "transactional.id": f"kafka-outbox-resume-{txn_id}", "acks": "all"}
    )
    try:
        _call(lambda: producer.init_transactions(timeout))
        history, letters = plan(reader, names, partitions, txn_id, slack_s)  # fenced from here
        return _write(producer, names, history, letters, timeout)
    finally:
        # A fenced producer is in a fatal state and its flush raises; what it wrote is
        # aborted either way, and the error that ended the resume is the one to report.
        with contextlib.suppress(KafkaException):
            producer.flush(timeout)


def _write(
    producer: Producer,
    names: TopicNames,
    history: History,
    letters: list[DeadLetter],
    timeout: float,
) -> Resumed:
    given_up = deciding_op(history.ops)
    assert given_up is not None  # plan() saw it
    partition = given_up.half_partition
    offsets: dict[str, list[int]] = {"half": [], "op": [], "marker": []}

    def delivered(kind: str) -> Any:
        # Nothing on an error: a fenced producer's abort served the failed reports with an
        # exception already set, and the first call into C raised SystemError (seen in the
        # concurrent-resume test). The shortfall below and the abort tell what happened.
        # And nothing without an offset: librdkafka reports a produce it retried and the
        # broker already had as delivered at an unknown offset, which the RESUMED op cannot
        # name (it named offset 0 before); the shortfall aborts the resume.
        def callback(err: KafkaError | None, msg: Message) -> None:
            offset = msg.offset() if err is None else None
            if offset is not None:
                offsets[kind].append(offset)

        return callback

    _call(producer.begin_transaction)
    try:
        for letter in letters:
            assert letter.half is not None  # plan() refused letters without one
            producer.produce(
                names.half,
                key=history.txn_id.encode(),
                value=letter.value,
                headers=list(copy_headers(letter.half, check_count=0)),
                partition=partition,
                on_delivery=delivered("half"),
            )
        producer.flush(timeout)
        if len(offsets["half"]) != len(letters):
            # Fenced while the copies were on their way: the abort says so (exit 5).
            _call(lambda: producer.abort_transaction(timeout))
            raise CommandError(
                f"the copies of {history.txn_id} were not all acknowledged in time, each with "
                "its offset; nothing was put back: run resume again"
            )
        op = OpRecord(
            txn_id=history.txn_id,
            state=OpState.RESUMED,
            producer_group=given_up.producer_group,
            half_partition=partition,
            half_offsets=tuple(sorted(offsets["half"])),
            decided_by=DecidedBy.CHECKER,
            decided_at_ms=int(time.time() * 1000),
            reason=f"resumed by {_who()}",
        )
        key, value = encode_op(op)
        producer.produce(
            names.op, key=key, value=value, partition=partition, on_delivery=delivered("op")
        )
        producer.produce(
            names.dead_letter,
            key=history.txn_id.encode(),
            value=None,
            headers=[(DeadLetterHeader.RESUMED_AT.value, str(op.decided_at_ms).encode())],
            partition=partition,
            on_delivery=delivered("marker"),
        )
        _call(lambda: producer.commit_transaction(timeout))
    except BaseException as err:
        with contextlib.suppress(KafkaException):  # fenced or gone: the broker aborts it
            producer.abort_transaction(timeout)
        if isinstance(err, KafkaException):  # produce() refused: fenced meanwhile, say
            _raise_for(err)
        raise
    return Resumed(
        txn_id=history.txn_id,
        partition=partition,
        copies=op.half_offsets,
        sources=tuple(letter.source_offset for letter in letters),
        op_offset=offsets["op"][0] if offsets["op"] else -1,
        marker_offset=offsets["marker"][0] if offsets["marker"] else -1,
    )


def describe(done: Resumed, names: TopicNames) -> str:
    return (
        f"resumed transaction {done.txn_id}: {len(done.copies)} message(s) put back on "
        f"{names.half}[{done.partition}] at offsets {list(done.copies)} (copies of offsets "
        f"{list(done.sources)}, check count 0); RESUMED op at {names.op}[{done.partition}]"
        f"@{done.op_offset}; resume marker at {names.dead_letter}[{done.partition}]"
        f"@{done.marker_offset}. The checker checks it again; the relay delivers it on COMMIT."
    )


def _who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # a container user without a passwd entry
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _call(fn: Any) -> Any:
    try:
        return fn()
    except KafkaException as err:
        _raise_for(err)


def _raise_for(cause: KafkaException) -> NoReturn:
    """The command's error for a Kafka call that raised ``cause``."""
    error: KafkaError = cause.args[0]
    if error.code() in (KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN):
        raise UnreachableError(f"Kafka did not answer: {error.str()}") from cause
    if error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED):
        raise RefusedError(
            "another resume of this transaction started while this one ran and took over "
            f"({error.str()}); nothing of this one was written - see `kafka-outbox inspect`"
        ) from cause
    raise CommandError(f"Kafka refused the resume transaction: {error.str()}") from cause

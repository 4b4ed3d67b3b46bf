"""One transaction's records on the topics: halves, ops, dead letters, resume markers, promotions.

A transaction id is a UUIDv7 whose first 48 bits are its creation time, so every record of it
lies at or after that time (less the producer's clock error): scans start at
``offsets_for_times(created - slack)`` instead of at the start of each partition.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Message

from outbox.errors import ProtocolError
from outbox.protocol.dead_letter import DeadLetterHeader
from outbox.protocol.half import HalfRecord, decode_half
from outbox.protocol.headers import Header
from outbox.protocol.ids import transaction_id_millis, validate_transaction_id
from outbox.protocol.op import OpRecord, decode_op
from outbox.protocol.states import TERMINAL_STATES, OpState
from outbox.protocol.topics import TopicNames
from outbox_cli.errors import UsageError
from outbox_cli.kafka import Reader, where

#: How far before its id's timestamp a transaction's records are looked for (producer clocks).
DEFAULT_SLACK_S = 600.0
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}

Headers = list[tuple[str, bytes]]


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``10m``, ``2h``, ``7d`` -> seconds (argparse type)."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration (e.g. 90s, 10m, 2h, 7d)")
    return float(match.group(1)) * _UNITS[match.group(2)]


def parse_txn_id(text: str) -> str:
    """The canonical transaction id, or a usage error saying what is wrong with it."""
    try:
        return validate_transaction_id(text.strip().lower())
    except ProtocolError as err:
        raise UsageError(f"{err}; a transaction id looks like 01a203d8-301f-7701-b6f4-...") from err


def headers_of(msg: Message) -> Headers:
    raw = msg.headers() or []
    pairs: list[tuple[str, Any]] = list(raw.items()) if isinstance(raw, dict) else list(raw)
    return [(n, v.encode() if isinstance(v, str) else (v or b"")) for n, v in pairs]


def header(headers: Sequence[tuple[str, bytes]], name: str) -> str | None:
    for n, v in headers:
        if n == name:
            return v.decode(errors="replace")
    return None


@dataclass(frozen=True)
class DeadLetter:
    """A half record parked on the dead-letter topic when its transaction was given up."""

    partition: int
    offset: int
    timestamp_ms: int
    value: bytes | None
    headers: Headers
    reason: str
    source_offset: int
    #: The half record it holds (read from its own headers); None if they do not read as one.
    half: HalfRecord | None

    @property
    def index(self) -> int:
        """Its message index; -1 when it does not hold a readable half record."""
        return -1 if self.half is None else self.half.index


def original_headers(headers: Headers) -> Headers:
    """A dead letter's headers without the ``outbox-dl-*`` ones it was given: the half
    record's own."""
    return [(n, v) for n, v in headers if not n.startswith("outbox-dl-")]


@dataclass(frozen=True)
class Marker:
    """A resume marker: the transaction was put back to be checked at ``resumed_at_ms``."""

    partition: int
    offset: int
    resumed_at_ms: int


@dataclass(frozen=True)
class Promoted:
    """A message of the transaction on its real topic."""

    topic: str
    partition: int
    offset: int
    index: int | None


@dataclass
class History:
    """Everything found about one transaction."""

    txn_id: str
    halves: list[HalfRecord] = field(default_factory=list)
    ops: list[OpRecord] = field(default_factory=list)
    tombstones: int = 0
    dead_letters: list[DeadLetter] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    promoted: list[Promoted] = field(default_factory=list)

    @property
    def created_ms(self) -> int:
        return transaction_id_millis(self.txn_id)

    @property
    def partition(self) -> int | None:
        if self.ops:
            return self.ops[-1].half_partition
        return self.halves[0].partition if self.halves else None

    @property
    def state(self) -> OpState | None:
        return effective_state(self.ops)

    def pending_dead_letters(self) -> list[DeadLetter]:
        """The dead letters written after the latest resume marker, one per message index."""
        last_marker = max((m.offset for m in self.markers), default=-1)
        latest: dict[int, DeadLetter] = {}
        for letter in self.dead_letters:
            if letter.offset > last_marker:
                latest[letter.index] = letter
        return [latest[i] for i in sorted(latest)]

    def found(self) -> bool:
        return bool(self.halves or self.ops or self.tombstones or self.dead_letters)


def deciding_op(ops: Iterable[OpRecord]) -> OpRecord | None:
    """The op that gives the transaction its state, in offset order: the first terminal op after
    the latest RESUMED decides; the RESUMED op when nothing decided since; None when no op did."""
    deciding: OpRecord | None = None
    for op in ops:
        if op.state is OpState.RESUMED or (
            op.state in TERMINAL_STATES and (deciding is None or deciding.state is OpState.RESUMED)
        ):
            deciding = op
    return deciding


def effective_state(ops: Iterable[OpRecord]) -> OpState | None:
    """The state :func:`deciding_op` gives; None while undecided."""
    op = deciding_op(ops)
    return None if op is None else op.state


def read_ops(
    reader: Reader, names: TopicNames, txn_id: str, partitions: int, since_ms: int
) -> tuple[list[OpRecord], int]:
    """The transaction's op records in offset order, and how many tombstones it has."""
    key = txn_id.encode()
    ops, tombstones = [], 0
    starts = reader.starts(names.op, range(partitions), since_ms)
    for msg in reader.read(names.op, starts):
        if msg.key() != key:
            continue
        try:
            partition, offset = where(msg)
            op = decode_op(msg.key(), msg.value(), partition=partition, offset=offset)
        except ProtocolError:
            continue  # the relay dead-letters it; it decides nothing
        if op is None:
            tombstones += 1
        else:
            ops.append(op)
    ops.sort(key=lambda o: (o.partition, o.offset))
    return ops, tombstones


def read_halves(
    reader: Reader, names: TopicNames, txn_id: str, partitions: Iterable[int], since_ms: int
) -> list[HalfRecord]:
    """The transaction's half records (originals and copies) in offset order."""
    key = txn_id.encode()
    found = []
    for msg in reader.read(names.half, reader.starts(names.half, partitions, since_ms)):
        if msg.key() != key:
            continue
        try:
            found.append(
                decode_half(
                    value=msg.value(),
                    headers=msg.headers(),
                    partition=where(msg)[0],
                    offset=where(msg)[1],
                    timestamp_ms=msg.timestamp()[1],
                )
            )
        except ProtocolError:
            continue
    return sorted(found, key=lambda r: (r.partition, r.offset))


def read_dead_letters(
    reader: Reader, names: TopicNames, txn_id: str, partition: int, since_ms: int
) -> tuple[list[DeadLetter], list[Marker]]:
    """The transaction's dead letters and resume markers in its dead-letter partition."""
    key = txn_id.encode()
    letters, markers = [], []
    starts = reader.starts(names.dead_letter, [partition], since_ms)
    for msg in reader.read(names.dead_letter, starts):
        if msg.key() != key:
            continue
        headers = headers_of(msg)
        resumed = header(headers, DeadLetterHeader.RESUMED_AT.value)
        reason = header(headers, DeadLetterHeader.REASON.value)
        if resumed is not None and reason is None:
            markers.append(Marker(*where(msg), _int(resumed)))
        elif reason is not None:
            source_offset = _int(header(headers, DeadLetterHeader.SOURCE_OFFSET.value))
            try:
                half: HalfRecord | None = decode_half(
                    value=msg.value(),
                    headers=original_headers(headers),
                    partition=where(msg)[0],
                    offset=source_offset,
                )
            except ProtocolError:
                half = None
            letters.append(
                DeadLetter(
                    partition=where(msg)[0],
                    offset=where(msg)[1],
                    timestamp_ms=msg.timestamp()[1],
                    value=msg.value(),
                    headers=headers,
                    reason=reason,
                    source_offset=source_offset,
                    half=half,
                )
            )
    return letters, markers


def read_promoted(
    reader: Reader, topics: dict[str, int], txn_id: str, real_topics: Iterable[str], since_ms: int
) -> list[Promoted]:
    """The transaction's messages on their real topics (header ``outbox-txn-id``)."""
    key = txn_id.encode()
    found = []
    for topic in sorted(set(real_topics)):
        if topic not in topics:
            continue
        for msg in reader.read(topic, reader.starts(topic, range(topics[topic]), since_ms)):
            headers = headers_of(msg)
            if any(n == Header.TXN_ID.value and v == key for n, v in headers):
                index = header(headers, Header.MESSAGE_INDEX.value)
                found.append(Promoted(topic, *where(msg), None if index is None else _int(index)))
    return found


def _int(text: str | None) -> int:
    try:
        return int(text or "")
    except ValueError:
        return -1

"""``kafka-outbox status``: what is undecided and given up, per producer group and partition.

Read from the topics themselves (``read_committed``), not from a service's memory, so it works
with no relay or checker running. Pending = half records whose transaction has no terminal op
(or was resumed since), counted once per (transaction id, message index) however many put-back
copies exist. Ages are measured on the broker's clock (LogAppendTime) against this machine's.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from outbox.errors import ProtocolError
from outbox.protocol.half import decode_half
from outbox.protocol.op import decode_op
from outbox.protocol.registry import decode_registration
from outbox.protocol.states import OpState
from outbox.protocol.topics import TopicNames
from outbox_cli.errors import OK, PROBLEM
from outbox_cli.history import effective_state
from outbox_cli.kafka import Reader, where


@dataclass
class Txn:
    group: str = ""
    partition: int = -1
    indexes: set[int] = field(default_factory=set)
    first_ms: int | None = None
    ops: list[Any] = field(default_factory=list)
    resumed_ms: int | None = None


@dataclass
class Row:
    group: str
    partition: int
    pending_transactions: int = 0
    pending_messages: int = 0
    oldest_pending_age_s: float | None = None
    given_up: int = 0


@dataclass
class Instance:
    instance_id: str
    check_url: str
    heartbeat_age_s: float


def collect(
    reader: Reader, names: TopicNames, partitions: int, since_ms: int | None, ttl_s: float
) -> tuple[list[Row], dict[str, list[Instance]], int]:
    """Rows per (group, partition), live instances per group, and unreadable records."""
    txns: dict[str, Txn] = defaultdict(Txn)
    unreadable = _read_halves(reader, names, partitions, since_ms, txns)
    unreadable += _read_ops(reader, names, partitions, since_ms, txns)
    now_ms = time.time() * 1000
    rows: dict[tuple[str, int], Row] = {}
    for txn in txns.values():
        if not txn.group:
            continue
        row = rows.setdefault((txn.group, txn.partition), Row(txn.group, txn.partition))
        state = effective_state(txn.ops)
        if state is OpState.GIVEN_UP:
            row.given_up += 1
        elif state in (None, OpState.RESUMED) and txn.indexes:
            row.pending_transactions += 1
            row.pending_messages += len(txn.indexes)
            since = txn.resumed_ms if state is OpState.RESUMED else txn.first_ms
            age = max(0.0, (now_ms - (since or now_ms)) / 1000)
            row.oldest_pending_age_s = max(row.oldest_pending_age_s or 0.0, age)
    live = live_instances(reader, names, ttl_s)
    for group in live:
        for p in range(partitions):
            rows.setdefault((group, p), Row(group, p))
    return [rows[k] for k in sorted(rows)], live, unreadable


def _read_halves(
    reader: Reader, names: TopicNames, partitions: int, since_ms: int | None, txns: dict[str, Txn]
) -> int:
    unreadable = 0
    for msg in reader.read(names.half, reader.starts(names.half, range(partitions), since_ms)):
        try:
            partition, offset = where(msg)
            record = decode_half(
                value=None, headers=msg.headers(), partition=partition, offset=offset
            )
        except ProtocolError:
            unreadable += 1
            continue
        txn = txns[record.txn_id]
        txn.group, txn.partition = record.producer_group, record.partition
        txn.indexes.add(record.index)
        stamp = msg.timestamp()[1]
        txn.first_ms = stamp if txn.first_ms is None else min(txn.first_ms, stamp)
    return unreadable


def _read_ops(
    reader: Reader, names: TopicNames, partitions: int, since_ms: int | None, txns: dict[str, Txn]
) -> int:
    unreadable = 0
    for msg in reader.read(names.op, reader.starts(names.op, range(partitions), since_ms)):
        try:
            partition, offset = where(msg)
            op = decode_op(msg.key(), msg.value(), partition=partition, offset=offset)
        except ProtocolError:
            unreadable += 1
            continue
        if op is None:
            continue
        txn = txns[op.txn_id]
        txn.ops.append(op)
        if not txn.group:  # halves outside the scanned window: the op says where they were
            txn.group, txn.partition = op.producer_group, op.half_partition
        if op.state is OpState.RESUMED:
            txn.resumed_ms = msg.timestamp()[1]
    return unreadable


def live_instances(reader: Reader, names: TopicNames, ttl_s: float) -> dict[str, list[Instance]]:
    """Producer instances per group whose latest heartbeat is younger than ``ttl_s``."""
    latest: dict[bytes, tuple[Any, int]] = {}
    for msg in reader.read(names.registry, reader.starts(names.registry, [0], None)):
        key = msg.key()
        if key is None:
            continue
        try:
            reg = decode_registration(msg.value())
        except ProtocolError:
            continue
        if reg is None:
            latest.pop(key, None)
        else:
            latest[key] = (reg, msg.timestamp()[1])
    now_ms = time.time() * 1000
    live: dict[str, list[Instance]] = defaultdict(list)
    for reg, stamp in latest.values():
        age = max(0.0, (now_ms - stamp) / 1000)
        if age <= ttl_s:
            live[reg.group].append(Instance(reg.instance_id, reg.check_url, round(age, 1)))
    return dict(live)


def report(
    rows: list[Row], live: dict[str, list[Instance]], unreadable: int, *, as_json: bool
) -> int:
    """Print the table (or JSON); 1 when any transaction is given up (an operator must act)."""
    given_up = sum(r.given_up for r in rows)
    if as_json:
        document = {
            "partitions": [asdict(r) for r in rows],
            "producers": {g: [asdict(i) for i in live.get(g, [])] for g in _groups(rows, live)},
            "given_up": given_up,
            "unreadable_records": unreadable,
        }
        print(json.dumps(document, indent=2))
    else:
        print(_table(rows, live))
        if unreadable:
            print(f"{unreadable} unreadable records skipped (the relay dead-letters them)")
        if given_up:
            print(
                f"{given_up} given-up transactions: check them (`kafka-outbox inspect TXN_ID`) "
                "and resume them (`kafka-outbox resume TXN_ID`) once their producer answers"
            )
    return PROBLEM if given_up else OK


def _groups(rows: list[Row], live: dict[str, list[Instance]]) -> list[str]:
    return sorted({r.group for r in rows} | set(live))


def _table(rows: list[Row], live: dict[str, list[Instance]]) -> str:
    head = ("GROUP", "PARTITION", "PENDING TXNS", "PENDING MSGS", "OLDEST PENDING", "GIVEN UP")
    body = [
        (
            r.group,
            str(r.partition),
            str(r.pending_transactions),
            str(r.pending_messages),
            "-" if r.oldest_pending_age_s is None else f"{r.oldest_pending_age_s:.1f}s",
            str(r.given_up),
        )
        for r in rows
    ]
    lines = _columns(head, body) if body else ["no transactions found on the half and op topics"]
    producers = [(g, str(len(live.get(g, [])))) for g in _groups(rows, live)]
    if producers:
        lines += ["", *_columns(("PRODUCER GROUP", "LIVE INSTANCES"), producers)]
    return "\n".join(lines)


def _columns(head: tuple[str, ...], body: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    return [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in [head, *body]
    ]

"""``kafka-outbox inspect TXN_ID``: one transaction's whole story, read from the topics.

Its half records (copies marked), its ops in offset order, where its messages were promoted, and
its dead letters and resume markers, if any.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from outbox.protocol.topics import TopicNames
from outbox_cli.errors import NotFoundError
from outbox_cli.history import (
    History,
    read_dead_letters,
    read_halves,
    read_ops,
    read_promoted,
)
from outbox_cli.kafka import Reader


def gather(
    reader: Reader, names: TopicNames, topics: dict[str, int], txn_id: str, slack_s: float
) -> History:
    """Everything about ``txn_id``, or :class:`NotFoundError` (exit 4) when nothing is there."""
    history = History(txn_id)
    since = history.created_ms - int(slack_s * 1000)
    partitions = topics[names.half]
    history.ops, history.tombstones = read_ops(reader, names, txn_id, partitions, since)
    where = [history.partition] if history.partition is not None else range(partitions)
    history.halves = read_halves(reader, names, txn_id, where, since)
    partition = history.partition
    if partition is not None:
        history.dead_letters, history.markers = read_dead_letters(
            reader, names, txn_id, partition, since
        )
    real = {h.message.topic for h in history.halves}
    history.promoted = read_promoted(reader, topics, txn_id, real, since)
    if not history.found():
        raise NotFoundError(
            f"unknown transaction {txn_id}: no half, op or dead-letter record on "
            f"{names.prefix}-* since {iso(since)} (created {iso(history.created_ms)}; "
            "widen the search with --slack)"
        )
    return history


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def document(history: History) -> dict[str, Any]:
    return {
        "txn_id": history.txn_id,
        "created": iso(history.created_ms),
        "state": history.state.value if history.state else None,
        "partition": history.partition,
        "halves": [
            {
                "partition": h.partition,
                "offset": h.offset,
                "index": h.index,
                "topic": h.message.topic,
                "producer_group": h.producer_group,
                "check_count": h.check_count,
                "copy_of": h.origin_offset,
                "appended": iso(h.timestamp_ms),
            }
            for h in history.halves
        ],
        "ops": [
            {
                "partition": o.partition,
                "offset": o.offset,
                "state": o.state.value,
                "decided_by": o.decided_by.value,
                "decided_at": iso(o.decided_at_ms),
                "half_offsets": list(o.half_offsets),
                "reason": o.reason,
            }
            for o in history.ops
        ],
        "tombstones": history.tombstones,
        "promoted": [asdict(p) for p in history.promoted],
        "dead_letters": [
            {
                "partition": d.partition,
                "offset": d.offset,
                "index": d.index,
                "source_offset": d.source_offset,
                "reason": d.reason,
            }
            for d in history.dead_letters
        ],
        "resume_markers": [
            {"partition": m.partition, "offset": m.offset, "resumed_at": iso(m.resumed_at_ms)}
            for m in history.markers
        ],
    }


def render(history: History, names: TopicNames) -> str:
    doc = document(history)
    groups = sorted(
        {h["producer_group"] for h in doc["halves"]} | {o.producer_group for o in history.ops}
    )
    lines = [
        f"transaction {history.txn_id}",
        f"  created   {doc['created']} (from its id)",
        f"  group     {', '.join(groups) or '-'}",
        f"  state     {doc['state'] or 'undecided'}",
        "",
        f"half records ({names.half}):",
    ]
    lines += _rows(
        ("partition", "offset", "index", "topic", "checks", "copy of", "appended"),
        [
            (
                h["partition"],
                h["offset"],
                h["index"],
                h["topic"],
                h["check_count"],
                "-" if h["copy_of"] is None else h["copy_of"],
                h["appended"],
            )
            for h in doc["halves"]
        ],
    )
    lines += ["", f"ops ({names.op}, in offset order):"]
    lines += _rows(
        ("partition", "offset", "state", "decided by", "decided at", "half offsets", "reason"),
        [
            (
                o["partition"],
                o["offset"],
                o["state"],
                o["decided_by"],
                o["decided_at"],
                ",".join(map(str, o["half_offsets"])),
                o["reason"] or "",
            )
            for o in doc["ops"]
        ],
    )
    if history.tombstones:
        lines.append(f"  and {history.tombstones} tombstones")
    lines += ["", "promoted records:"]
    lines += _rows(
        ("topic", "partition", "offset", "index"),
        [
            (p.topic, p.partition, p.offset, "-" if p.index is None else p.index)
            for p in history.promoted
        ],
    )
    if history.dead_letters or history.markers:
        lines += ["", f"dead letters ({names.dead_letter}):"]
        lines += _rows(
            ("partition", "offset", "index", "source offset", "reason"),
            [
                (d["partition"], d["offset"], d["index"], d["source_offset"], d["reason"])
                for d in doc["dead_letters"]
            ],
        )
        lines += [
            f"  resume marker at offset {m['offset']}: resumed {m['resumed_at']}"
            for m in doc["resume_markers"]
        ]
    return "\n".join(lines)


def _rows(head: tuple[str, ...], body: list[tuple[Any, ...]]) -> list[str]:
    if not body:
        return ["  (none)"]
    cells = [tuple(str(c) for c in row) for row in [head, *body]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells
    ]


def show(history: History, names: TopicNames, *, as_json: bool) -> None:
    print(json.dumps(document(history), indent=2) if as_json else render(history, names))

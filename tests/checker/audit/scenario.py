"""Small in-memory topic contents for the pure finding functions: no Kafka, typed rows.

A :class:`Scenario` is what :mod:`checker.audit.records` would make of the topics: half, op and
promoted rows with offsets counted per topic partition, broker times given by the test.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from checker.audit import ledger as L
from outbox.protocol.ids import new_transaction_id
from outbox.protocol.states import CheckBy

HALF_SCHEMA = (
    "txn_id string, producer_group string, real_topic string, real_key binary, "
    "message_index int, message_count int, check_count int, origin_offset long, "
    "partition int, offset long, ts_ms long, in_range boolean, check_by string"
)
OP_SCHEMA = (
    "txn_id string, state string, producer_group string, half_partition int, "
    "half_offsets array<long>, message_count int, decided_by string, decided_at_ms long, "
    "reason string, partition int, offset long, ts_ms long, in_range boolean"
)
PROMOTED_SCHEMA = (
    "topic string, partition int, offset long, ts_ms long, key binary, txn_id string, "
    "producer_group string, message_index int, in_range boolean"
)
DEAD_LETTER_SCHEMA = (
    "txn_id string, message_index int, reason string, partition int, offset long, ts_ms long"
)
EVIDENCE_SCHEMA = "txn_id string, kind string, producer_group string, created_ms long"


@dataclass
class Txn:
    txn_id: str
    group: str
    partition: int
    keys: list[bytes | None]
    topic: str
    offsets: list[int] = field(default_factory=list)
    check_by: str = CheckBy.EVIDENCE.value


@dataclass
class Scenario:
    halves: list[tuple[Any, ...]] = field(default_factory=list)
    ops: list[tuple[Any, ...]] = field(default_factory=list)
    promoted: list[tuple[Any, ...]] = field(default_factory=list)
    dead_letters: list[tuple[Any, ...]] = field(default_factory=list)
    evidence: list[tuple[Any, ...]] = field(default_factory=list)
    _next: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))

    def _offset(self, topic: str, partition: int) -> int:
        offset = self._next[(topic, partition)]
        self._next[(topic, partition)] += 1
        return offset

    def txn(
        self,
        messages: int = 1,
        *,
        at: int = 1_000,
        key: bytes | None = b"k",
        keys: list[bytes | None] | None = None,
        partition: int = 0,
        topic: str = "orders",
        group: str = "g",
        in_range: bool = True,
        check_by: str = CheckBy.EVIDENCE.value,
        txn_id: str | None = None,
        announced: bool = True,
    ) -> Txn:
        """Half records of a new transaction, all stamped ``at`` (``check_by``: what their
        ``outbox-check-by`` header says, ``evidence`` when the producer writes none;
        ``announced``: whether they carry the message count, as ``send_batch`` and a
        decorator's batch do and one ``send()`` after another does not)."""
        t = Txn(
            txn_id or new_transaction_id(),
            group,
            partition,
            keys or [key] * messages,
            topic,
            check_by=check_by,
        )
        for index, k in enumerate(t.keys):
            offset = self._offset("half", partition)
            t.offsets.append(offset)
            self.halves.append(
                (
                    t.txn_id,
                    group,
                    topic,
                    k,
                    index,
                    len(t.keys) if announced else None,
                    0,
                    None,
                    partition,
                    offset,
                    at,
                    in_range,
                    check_by,
                )
            )
        return t

    def put_back(self, t: Txn, index: int, *, at: int, in_range: bool = True) -> None:
        offset = self._offset("half", t.partition)
        self.halves.append(
            (
                t.txn_id,
                t.group,
                t.topic,
                t.keys[index],
                index,
                len(t.keys),
                1,
                t.offsets[index],
                t.partition,
                offset,
                at,
                in_range,
                t.check_by,
            )
        )

    def op(
        self,
        t: Txn,
        state: str,
        *,
        at: int,
        by: str = "producer",
        reason: str | None = None,
        in_range: bool = True,
        offsets: list[int] | None = None,
    ) -> int:
        """An op record (naming ``offsets``, by default all of ``t``'s); returns its offset."""
        named = t.offsets if offsets is None else offsets
        offset = self._offset("op", t.partition)
        self.ops.append(
            (
                t.txn_id,
                state,
                t.group,
                t.partition,
                named,
                len(named),
                by,
                at,
                reason,
                t.partition,
                offset,
                at,
                in_range,
            )
        )
        return offset

    def promote(
        self,
        t: Txn,
        indices: list[int] | None = None,
        *,
        at: int,
        partition: int = 0,
        in_range: bool = True,
    ) -> None:
        for index in indices if indices is not None else range(len(t.keys)):
            offset = self._offset(t.topic, partition)
            self.promoted.append(
                (t.topic, partition, offset, at, t.keys[index], t.txn_id, t.group, index, in_range)
            )

    def dead_letter(self, t: Txn, reason: str, *, at: int) -> None:
        for index in range(len(t.keys)):
            offset = self._offset("dl", t.partition)
            self.dead_letters.append((t.txn_id, index, reason, t.partition, offset, at))

    def evidence_row(self, t: Txn, kind: str = "evidence", *, at: int = 1_000) -> None:
        self.evidence.append((t.txn_id, kind, t.group, at))

    # -- DataFrames ------------------------------------------------------------------------

    def frames(self, spark: Any) -> dict[str, Any]:
        return {
            "halves": spark.createDataFrame(self.halves, HALF_SCHEMA),
            "ops": spark.createDataFrame(self.ops, OP_SCHEMA),
            "promoted": spark.createDataFrame(self.promoted, PROMOTED_SCHEMA),
            "dead_letters": spark.createDataFrame(self.dead_letters, DEAD_LETTER_SCHEMA),
            "evidence": spark.createDataFrame(self.evidence, EVIDENCE_SCHEMA),
        }

    def ledger(self, spark: Any) -> tuple[Any, dict[str, Any]]:
        """The ledger the finding functions judge, and the frames it came from."""
        frames = self.frames(spark)
        delivered = L.deliveries(frames["promoted"])
        txns = L.transactions(L.messages(frames["halves"]))
        book = L.ledger(txns, L.decisions(frames["ops"]), delivered).cache()
        frames["delivered"] = delivered
        return book, frames


def txn_id_at(ms: int) -> str:
    """A UUIDv7 transaction id that says its transaction began at ``ms`` (Unix ms)."""
    rest = uuid.UUID(new_transaction_id()).int & ((1 << 80) - 1)  # version, variant, random
    return str(uuid.UUID(int=(ms << 80) | rest))


def ids(frame: Any) -> set[str]:
    return {r["txn_id"] for r in frame.select("txn_id").collect()}

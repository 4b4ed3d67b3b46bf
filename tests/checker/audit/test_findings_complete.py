"""Every row and every column of every finding of the seeded audit, against what was planted.

The other seeded tests judge which transactions each finding names; this one pins the whole
findings, so that a change to how the audit computes them (its layout, its id encoding, how
many passes it makes) cannot change a single value unnoticed. Each expected value comes from
the seeding (:mod:`tests.checker.audit.seeded`): ids, groups, half partitions and offsets,
states, deciders, reasons, counts and indices exactly; what the seeding cannot know in
advance (broker timestamps, offsets of op and real-topic records) by kind and bounds, and by
how it relates to the other columns (a duplicate's two records differ, a conflict's op comes
after the first, an out-of-order record's predecessor has the later COMMIT).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from checker.audit.findings import FINDINGS
from outbox.protocol import Header
from outbox.testing.stream import StreamTxn
from tests.checker.audit.conftest import SeededAudit

pytestmark = pytest.mark.integration

Check = Callable[[Any], bool]


def _offset(value: Any) -> bool:
    return isinstance(value, int) and value >= 0


def _partition(value: Any) -> bool:
    return isinstance(value, int) and 0 <= value < 3


class _Expect:
    """Expected rows of each finding, built from one seeded run."""

    def __init__(self, audit: SeededAudit) -> None:
        self.seeded = audit.seeded
        self.as_of_ms = int(audit.result.summary["parameters"]["as_of_ms"])
        self.group = audit.seeded.group
        self.orders, self.payments = audit.seeded.real_topics

    def ms(self, value: Any) -> bool:
        """A broker or producer timestamp of the seeding."""
        began, ended = self.seeded.began_ms, self.seeded.ended_ms
        return isinstance(value, int) and began - 1_000 <= value <= ended + 1_000

    def txn(self, name: str) -> StreamTxn:
        return self.seeded.planted[name]

    def half(self, name: str) -> dict[str, Any]:
        """The half-topic columns every transaction-level finding shows."""
        t = self.txn(name)
        return {
            "txn_id": t.txn_id,
            "producer_group": self.group,
            "half_partition": t.partition,
            "half_offsets": list(t.half_offsets()),
            "real_topics": sorted({m.topic for m in t.messages}),
            "first_half_ms": self.ms,
        }

    def decision(self, name: str, state: str, decided_by: str) -> dict[str, Any]:
        return {
            "state": state,
            "decided_by": decided_by,
            "decision_ms": self.ms,
            "decision_partition": self.txn(name).partition,
            "decision_offset": _offset,
        }

    def rows(self) -> dict[str, list[dict[str, Any]]]:
        lost = {
            **self.half("lost"),
            **self.decision("lost", "COMMIT", "producer"),
            "expected": 1,
            "delivered": 0,
            "missing_indices": [0],
        }
        partial = {
            **self.half("partial"),
            **self.decision("partial", "COMMIT", "producer"),
            "expected": 3,
            "delivered": 2,
            "missing_indices": [1],
        }
        phantom = {
            "txn_id": self.txn("phantom").txn_id,
            "producer_group": self.group,
            "topic": self.orders,
            "partition": _partition,
            "offset": _offset,
            "ts_ms": self.ms,
            "message_index": 0,
            "state": "ROLLBACK",
            "decided_by": "producer",
            "decision_ms": self.ms,
            "reason": "decided ROLLBACK",
        }
        duplicate = {
            "txn_id": self.txn("duplicate").txn_id,
            "producer_group": self.group,
            "state": "COMMIT",
            "message_index": 0,
            "times": 2,
            "records": self._two_records,
        }
        early, late = self.txn("early"), self.txn("late")
        out_of_order = {
            "txn_id": early.txn_id,
            "producer_group": self.group,
            "topic": self.orders,
            "partition": _partition,
            "offset": _offset,
            "ts_ms": self.ms,
            "key": "same-key",
            "message_index": 0,
            "commit_partition": early.partition,
            "commit_offset": _offset,
            "after_txn_id": late.txn_id,
            "after_offset": _offset,
            "after_commit_offset": _offset,
        }
        stuck = {
            **self.half("stuck"),
            "since_ms": self.ms,
            "age_ms": lambda v: isinstance(v, int) and v > 10 * 60_000 - 5_000,
            "state": "UNDECIDED",
            "check_count": 0,
            "messages_seen": 1,
            "copies": 0,
        }
        given_up = {
            **self.half("given_up"),
            "decision_ms": self.ms,
            "decided_at_ms": self.ms,
            "decided_by": "checker",
            "reason": "still UNKNOWN after 15 checks",
            "expected": 1,
            "dead_lettered": 1,
        }
        conflict = self.txn("conflict")
        conflicting = {
            "txn_id": conflict.txn_id,
            "producer_group": self.group,
            "first_state": "COMMIT",
            "first_decided_by": "producer",
            "first_partition": conflict.partition,
            "first_offset": _offset,
            "first_ms": self.ms,
            "conflicting_state": "ROLLBACK",
            "conflicting_decided_by": "checker",
            "conflicting_partition": conflict.partition,
            "conflicting_offset": _offset,
            "conflicting_ms": self.ms,
        }
        evidence_rollback = {
            "txn_id": self.txn("evidence_rollback").txn_id,
            "producer_group": self.group,
            "evidence_created_ms": self.ms,
            **self.decision("evidence_rollback", "ROLLBACK", "checker"),
            "first_half_ms": self.ms,
            "reason": None,
        }
        without = [
            {
                "txn_id": self.txn(name).txn_id,
                "producer_group": self.group,
                **{
                    k: v
                    for k, v in self.decision(name, "COMMIT", "producer").items()
                    if k != "state"
                },
                "first_half_ms": self.ms,
                "evidence": evidence,
            }
            for name, evidence in (("no_evidence", "none"), ("fenced_commit", "fence"))
        ]
        ids = self.seeded.unreadable_ids
        unreadable = [
            {
                "topic": f"{self.seeded.prefix}-half",
                "partition": 1,
                "offset": _offset,
                "ts_ms": self.ms,
                "txn_id": ids["future_half"],
                "problem": f"{Header.SCHEMA_VERSION.value} 2 without an {Header.HALF.value} header",
            },
            {
                "topic": f"{self.seeded.prefix}-op",
                "partition": 1,
                "offset": _offset,
                "ts_ms": self.ms,
                "txn_id": ids["future_op"],
                "problem": "unknown schema version 2",
            },
        ]
        return {
            "lost": [lost],
            "partial": [partial],
            "phantom": [phantom],
            "duplicate": [duplicate],
            "out_of_order": [out_of_order],
            "stuck": [stuck],
            "given_up": [given_up],
            "conflicting_decisions": [conflicting],
            "evidence_without_commit": [evidence_rollback],
            "commit_without_evidence": without,
            "unreadable": unreadable,
        }

    def _two_records(self, records: Any) -> bool:
        return (
            isinstance(records, list)
            and len(records) == 2
            and records == sorted(records, key=lambda r: (r["topic"], r["partition"], r["offset"]))
            and all(
                r["topic"] == self.orders
                and _partition(r["partition"])
                and _offset(r["offset"])
                and self.ms(r["ts_ms"])
                for r in records
            )
            and records[0]["offset"] != records[1]["offset"]
        )


def _mismatches(expected: dict[str, Any], row: dict[str, Any]) -> list[str]:
    wrong = []
    for column, want in expected.items():
        got = row[column]
        ok = want(got) if callable(want) else got == want
        if not ok:
            wrong.append(f"{column}={got!r} (expected {getattr(want, '__name__', want)!r})")
    return wrong


def _collected(seeded_audit: SeededAudit, name: str) -> list[dict[str, Any]]:
    rows = seeded_audit.result.findings[name].collect()
    return [r.asDict(recursive=True) for r in rows]


@pytest.mark.parametrize("finding", list(FINDINGS))
def test_each_finding_holds_exactly_the_planted_rows_column_for_column(
    seeded_audit: SeededAudit, finding: str
) -> None:
    expected = sorted(_Expect(seeded_audit).rows()[finding], key=lambda r: str(r["txn_id"]))
    rows = sorted(_collected(seeded_audit, finding), key=lambda r: str(r["txn_id"]))
    assert [list(r) for r in rows] == [list(e) for e in expected]  # columns, in order
    for want, row in zip(expected, rows, strict=True):
        assert not _mismatches(want, row), (finding, _mismatches(want, row))


def test_the_pinned_columns_relate_as_the_seeding_ordered_them(
    seeded_audit: SeededAudit,
) -> None:
    (late,) = _collected(seeded_audit, "out_of_order")
    # the late record was promoted first, and its COMMIT came after the early one's
    assert late["after_offset"] < late["offset"]
    assert late["after_commit_offset"] > late["commit_offset"]
    (conflict,) = _collected(seeded_audit, "conflicting_decisions")
    assert conflict["conflicting_offset"] > conflict["first_offset"]
    assert conflict["conflicting_ms"] >= conflict["first_ms"]
    (stuck,) = _collected(seeded_audit, "stuck")
    assert stuck["since_ms"] == stuck["first_half_ms"]
    as_of_ms = seeded_audit.result.summary["parameters"]["as_of_ms"]
    assert stuck["age_ms"] == as_of_ms - stuck["since_ms"]

"""What a round says once written: each COMMIT and ROLLBACK the checker wrote, with the half
offsets it names - what a partial delivery's investigation needs first (the op record of the one
the Spark audit found in the three-broker fault test was not kept)."""

from __future__ import annotations

import logging

import pytest

from checker.plan import RoundPlan
from outbox.protocol import DecidedBy, OpRecord, OpState

TXN = "01a203d8-301f-7701-b6f4-468000000001"


def op(state: OpState, offsets: tuple[int, ...]) -> OpRecord:
    return OpRecord(
        txn_id=TXN,
        state=state,
        producer_group="orders",
        half_partition=2,
        half_offsets=offsets,
        decided_by=DecidedBy.CHECKER,
        decided_at_ms=0,
        reason="gone" if state is OpState.GIVEN_UP else None,
    )


def test_the_decisions_written_are_logged_with_the_offsets_they_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    plan = RoundPlan()
    plan.decision(op(OpState.COMMIT, (3660, 3663)))
    plan.decision(op(OpState.ROLLBACK, (7,)))
    plan.decision(op(OpState.GIVEN_UP, (9,)))  # logged with its reason when decided
    with caplog.at_level(logging.INFO, logger="checker"):
        plan.log_written()
    said = [(r.getMessage(), r.offsets, r.partition) for r in caplog.records]  # type: ignore[attr-defined]
    assert said == [
        (
            f"decided COMMIT for transaction {TXN} of group orders: half partition 2, offsets "
            "[3660, 3663]",
            [3660, 3663],
            2,
        ),
        (
            f"decided ROLLBACK for transaction {TXN} of group orders: half partition 2, "
            "offsets [7]",
            [7],
            2,
        ),
    ]

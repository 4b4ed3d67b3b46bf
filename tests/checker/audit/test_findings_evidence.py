"""Evidence table vs op topic: commit evidence needs a COMMIT op and a COMMIT op evidence."""

from __future__ import annotations

import uuid

import pytest

from checker.audit.findings.evidence import commit_without_evidence, evidence_without_commit
from outbox.pruning import PRUNE_MARGIN_MS
from tests.checker.audit.scenario import Scenario, ids, txn_id_at

pytestmark = pytest.mark.integration  # starts Spark (a JVM), no Kafka

AS_OF, WINDOW = 1_000_000, 456_000
HORIZON, DAY = 1_795_000_000_000, 86_400_000


def test_evidence_without_a_commit_op_is_reported_once_the_checker_had_its_chance(spark) -> None:
    sc = Scenario()
    committed = sc.txn()
    sc.op(committed, "COMMIT", at=2_000)
    rolled_back = sc.txn()
    sc.op(rolled_back, "ROLLBACK", at=2_000)
    given_up = sc.txn()
    sc.op(given_up, "GIVEN_UP", at=2_000, by="checker")
    silent = sc.txn(at=1_000)
    silent_young = sc.txn(at=AS_OF - 1_000)
    for t in (committed, rolled_back, given_up, silent, silent_young):
        sc.evidence_row(t)
    fenced = sc.txn()
    sc.op(fenced, "ROLLBACK", at=2_000, by="checker")
    sc.evidence_row(fenced, "fence")
    book, frames = sc.ledger(spark)

    found = evidence_without_commit(book, frames["evidence"], as_of_ms=AS_OF, window_ms=WINDOW)

    states = {r.txn_id: r.state for r in found.collect()}
    assert states == {
        rolled_back.txn_id: "ROLLBACK",
        given_up.txn_id: "GIVEN_UP",
        silent.txn_id: "UNDECIDED",
    }


def test_a_commit_op_without_evidence_or_with_a_fence_is_reported_for_covered_groups(
    spark,
) -> None:
    sc = Scenario()
    proven = sc.txn()
    sc.op(proven, "COMMIT", at=2_000)
    sc.evidence_row(proven)
    unproven = sc.txn()
    sc.op(unproven, "COMMIT", at=2_000)
    fenced = sc.txn()
    sc.op(fenced, "COMMIT", at=2_000, by="checker")
    sc.evidence_row(fenced, "fence")
    other_group = sc.txn(group="payments")
    sc.op(other_group, "COMMIT", at=2_000)
    book, frames = sc.ledger(spark)

    found = commit_without_evidence(book, frames["evidence"])
    assert {r.txn_id: r.evidence for r in found.collect()} == {
        unproven.txn_id: "none",
        fenced.txn_id: "fence",
    }
    named = commit_without_evidence(book, frames["evidence"], groups=["g", "payments"])
    assert ids(named) == {unproven.txn_id, fenced.txn_id, other_group.txn_id}


def test_a_commit_whose_checks_the_listener_answers_needs_no_evidence_row(spark) -> None:
    sc = Scenario()
    proven = sc.txn()
    sc.op(proven, "COMMIT", at=2_000)
    sc.evidence_row(proven)
    listener = sc.txn(2, check_by="listener")  # TransactionalProducer: never writes a row
    sc.put_back(listener, 1, at=1_500)
    sc.op(listener, "COMMIT", at=2_000)
    sc.promote(listener, at=3_000)
    newer = sc.txn(check_by="a-resolver-this-audit-does-not-know")
    sc.op(newer, "COMMIT", at=2_000)
    sc.promote(newer, at=3_000)
    unproven = sc.txn(check_by="evidence")  # as written when the header is there
    sc.op(unproven, "COMMIT", at=2_000)
    sc.promote(unproven, at=3_000)
    headerless = sc.txn()
    sc.op(headerless, "COMMIT", at=2_000)
    book, frames = sc.ledger(spark)

    found = commit_without_evidence(book, frames["evidence"])

    assert ids(found) == {unproven.txn_id, headerless.txn_id}


def test_a_commit_whose_row_may_have_been_pruned_is_not_reported(spark) -> None:
    sc = Scenario()
    pruned = sc.txn(txn_id=txn_id_at(HORIZON - DAY))
    within_margin = sc.txn(txn_id=txn_id_at(HORIZON + PRUNE_MARGIN_MS - 1))
    after = sc.txn(txn_id=txn_id_at(HORIZON + PRUNE_MARGIN_MS))
    fenced_before = sc.txn(txn_id=txn_id_at(HORIZON - DAY))
    sc.evidence_row(fenced_before, "fence")  # a row still there: not pruned, a contradiction
    ageless = sc.txn(txn_id=str(uuid.uuid4()))  # not a UUIDv7: when it began is not known
    proven = sc.txn(txn_id=txn_id_at(HORIZON + DAY))
    sc.evidence_row(proven)
    for t in (pruned, within_margin, after, fenced_before, ageless, proven):
        sc.op(t, "COMMIT", at=2_000)
    book, frames = sc.ledger(spark)

    found = commit_without_evidence(book, frames["evidence"], horizon_ms=HORIZON)

    assert {r.txn_id: r.evidence for r in found.collect()} == {
        after.txn_id: "none",
        fenced_before.txn_id: "fence",
    }
    never_pruned = commit_without_evidence(book, frames["evidence"], horizon_ms=None)
    assert ids(never_pruned) == {
        pruned.txn_id,
        within_margin.txn_id,
        after.txn_id,
        fenced_before.txn_id,
        ageless.txn_id,
    }

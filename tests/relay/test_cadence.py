"""The relay's commit cadence, on a clock the test moves (relay/cadence.py)."""

from __future__ import annotations

import pytest

from relay.cadence import CommitCadence
from relay.settings import RelaySettings


def cadence(**settings: object) -> CommitCadence:
    values: dict[str, object] = {
        "commit_interval_s": 0.05,
        "commit_spacing_s": 0.01,
        "poll_timeout_s": 0.01,
        "batch_max_records": 100,
        **settings,
    }
    return CommitCadence(RelaySettings(bootstrap_servers="k", **values), now=0.0)  # type: ignore[arg-type]


def test_after_a_quiet_spell_an_op_commits_at_once() -> None:
    c = cadence()
    c.polled(1, 1)
    assert c.due(5.0)


def test_ops_right_after_a_transaction_wait_for_the_spacing_and_the_poll_waits_no_longer() -> None:
    c = cadence()
    c.committed(1.0, transaction=True)
    c.polled(2, 1)
    assert not c.due(1.004)
    assert c.poll_timeout(1.004) == pytest.approx(0.006)
    c.polled(0, 0)
    assert c.due(1.010)
    assert c.poll_timeout(1.020) == 0.0


def test_a_commit_that_wrote_nothing_does_not_restart_the_spacing() -> None:
    c = cadence()
    c.committed(1.0, transaction=True)
    c.committed(1.008, transaction=False)
    c.polled(1, 1)
    assert c.due(1.010)


def test_half_records_alone_wait_for_the_interval() -> None:
    c = cadence()
    c.committed(1.0, transaction=True)
    c.polled(3, 0)
    assert c.poll_timeout(1.02) == 0.01
    assert not c.due(1.02)
    assert c.due(1.05)


def test_a_full_batch_commits_whatever_the_spacing() -> None:
    c = cadence()
    c.committed(1.0, transaction=True)
    c.polled(100, 0)
    assert c.due(1.0001)


def test_a_backlog_commits_full_batches_and_a_poll_that_caught_up_keeps_the_spacing() -> None:
    c = cadence()
    c.polled(60, 10)
    c.polled(100, 10)  # still a backlog: the batch is filling
    assert c.due(5.0)  # full
    c.committed(5.0, transaction=True)
    c.polled(100, 5)
    c.committed(5.001, transaction=True)
    c.polled(99, 5)  # caught up, but the spacing has not passed
    assert not c.due(5.005)


def test_with_no_spacing_every_caught_up_op_commits() -> None:
    c = cadence(commit_spacing_s=0.0)
    for t in (1.0, 1.001, 1.002):
        c.polled(1, 1)
        assert c.due(t)
        c.committed(t, transaction=True)


def test_a_spacing_longer_than_the_interval_is_the_interval() -> None:
    c = cadence(commit_interval_s=0.005, commit_spacing_s=0.01)
    c.committed(1.0, transaction=True)
    c.polled(1, 1)
    assert c.poll_timeout(1.0) == pytest.approx(0.005)
    assert not c.due(1.004) and c.due(1.006)


def test_without_caught_up_commits_only_the_interval_or_a_full_batch_commits() -> None:
    c = cadence(commit_when_caught_up=False, commit_interval_s=25.0)
    c.polled(1, 1)
    assert not c.due(10.0)
    assert c.poll_timeout(10.0) == 0.01
    assert c.due(25.0)

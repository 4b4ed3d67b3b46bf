"""The consumer-side repeat filter (pure logic)."""

from __future__ import annotations

import pytest

from outbox import ConfigurationError, Deduplicator
from outbox.consumer import message_id


def promoted(txn: str, index: int) -> list[tuple[str, bytes]]:
    return [("app", b"x"), ("outbox-txn-id", txn.encode()), ("outbox-message-index", b"%d" % index)]


def test_a_repeat_within_the_window_is_dropped_and_counted() -> None:
    dedup = Deduplicator(window=10)
    assert dedup.first_time(promoted("t1", 0))
    assert dedup.first_time(promoted("t1", 1))  # another message of the same transaction
    assert not dedup.first_time(promoted("t1", 0))
    assert dedup.repeats == 1


def test_the_window_is_bounded_and_forgets_the_oldest_first() -> None:
    dedup = Deduplicator(window=2)
    for txn in ("a", "b", "c"):
        assert dedup.first_time(promoted(txn, 0))
    assert len(dedup) == 2
    assert dedup.first_time(promoted("a", 0))  # forgotten: seen as new again
    assert not dedup.first_time(promoted("c", 0))


def test_records_not_written_by_the_relay_always_pass_and_mappings_work_too() -> None:
    dedup = Deduplicator()
    assert dedup.first_time([("app", b"x")]) and dedup.first_time(None)
    assert dedup.first_time([("app", b"x")])
    mapping = {"outbox-txn-id": "t", "outbox-message-index": "3"}
    assert message_id(mapping) == (b"t", b"3")
    assert dedup.first_time(mapping) and not dedup.first_time(promoted("t", 3))


def test_a_window_below_one_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="window=0"):
        Deduplicator(window=0)

"""--from / --to / --as-of values and durations parse to what docs/audit.md promises."""

from __future__ import annotations

import pytest

from checker.audit.bounds import (
    AtOffsets,
    AtTime,
    Earliest,
    Latest,
    check_pair,
    parse_bound,
    parse_duration_ms,
    parse_time_ms,
)
from checker.audit.errors import AuditConfigError

NOW = 1_795_000_000_000


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("90", 90_000),
        ("90s", 90_000),
        ("500ms", 500),
        ("5m", 300_000),
        ("2h", 7_200_000),
        ("7d", 604_800_000),
        ("1.5s", 1500),
    ],
)
def test_durations_take_a_unit_and_default_to_seconds(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "5 minutes", "-3s", "s"])
def test_a_malformed_duration_is_refused_with_examples(text: str) -> None:
    with pytest.raises(AuditConfigError, match="90s, 500ms"):
        parse_duration_ms(text)


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("now", NOW),
        ("now-2h", NOW - 7_200_000),
        ("now+5m", NOW + 300_000),
        ("1795000000123", 1_795_000_000_123),
        ("2026-11-22T10:00:00Z", 1_795_341_600_000),
        ("2026-11-22T10:00:00", 1_795_341_600_000),
        ("2026-11-22T11:00:00+01:00", 1_795_341_600_000),
    ],
)
def test_times_are_iso_unix_ms_or_relative_to_now(text: str, ms: int) -> None:
    assert parse_time_ms(text, now_ms=NOW) == ms


def test_a_time_that_is_not_one_is_refused() -> None:
    with pytest.raises(AuditConfigError, match="ISO-8601"):
        parse_time_ms("yesterday", now_ms=NOW)


def test_bounds_are_keywords_times_or_offsets_json() -> None:
    assert parse_bound("earliest", now_ms=NOW, what="--from") == Earliest()
    assert parse_bound("latest", now_ms=NOW, what="--to") == Latest()
    assert parse_bound("now-1h", now_ms=NOW, what="--from") == AtTime(NOW - 3_600_000)
    offsets = parse_bound('{"t": {"0": 12, "2": -2}}', now_ms=NOW, what="--from")
    assert offsets == AtOffsets({"t": {0: 12, 2: -2}})


@pytest.mark.parametrize("text", ['{"t": 3}', '{"t": {"x": 1}}', '{"t": {"0": -5}}', "{oops"])
def test_malformed_offsets_are_refused(text: str) -> None:
    with pytest.raises(AuditConfigError, match="--from"):
        parse_bound(text, now_ms=NOW, what="--from")


@pytest.mark.parametrize(
    ("start", "end", "message"),
    [
        (Latest(), Latest(), "--from latest"),
        (Earliest(), Earliest(), "--to earliest"),
        (AtTime(5), AtOffsets({"t": {0: 1}}), "mix a time with offsets"),
        (AtTime(5), AtTime(5), "must be before"),
    ],
)
def test_pairs_that_describe_no_range_are_refused(start, end, message: str) -> None:
    with pytest.raises(AuditConfigError, match=message):
        check_pair(start, end)


def test_keywords_go_with_times_and_with_offsets() -> None:
    check_pair(Earliest(), AtTime(5))
    check_pair(AtOffsets({"t": {0: 1}}), Latest())
    check_pair(AtTime(1), AtTime(2))

"""The internal topics' settings: the op topic is bounded by a retention that outlasts the half
records it decides and the audit window, and settings that break that are refused."""

from __future__ import annotations

import pytest

from outbox import ConfigurationError, OutboxSettings
from outbox.protocol.topics import (
    DEFAULT_HALF_RETENTION_MS,
    DEFAULT_MIN_COMPACTION_LAG_MS,
    DEFAULT_OP_RETENTION_MS,
    TopicNames,
    op_retention_problem,
    required_op_retention_ms,
    topic_settings,
)

DAY_MS = 24 * 3600 * 1000
NAMES = TopicNames("__outbox")


def settings(**overrides: int) -> OutboxSettings:
    return OutboxSettings(bootstrap_servers="k:9092", producer_group="g", **overrides)


def test_the_op_topic_is_compacted_and_deleted_after_14_days_by_default() -> None:
    assert topic_settings(NAMES, NAMES.op) == {
        "cleanup.policy": "compact,delete",
        "retention.ms": str(14 * DAY_MS),
        "min.compaction.lag.ms": str(7 * DAY_MS),
        "message.timestamp.type": "LogAppendTime",
    }


def test_the_half_topic_keeps_its_records_for_kafkas_default_week_written_on_the_topic() -> None:
    assert topic_settings(NAMES, NAMES.half) == {
        "cleanup.policy": "delete",
        "retention.ms": str(7 * DAY_MS),
        "message.timestamp.type": "LogAppendTime",
    }


def test_the_default_op_retention_outlasts_the_half_records_by_a_whole_segment_roll() -> None:
    # A half record lives up to retention.ms + segment.ms (Kafka's default: 7 days): whole
    # segments are deleted. Its decision must still be there.
    default_segment_ms = 7 * DAY_MS
    assert DEFAULT_HALF_RETENTION_MS + default_segment_ms <= DEFAULT_OP_RETENTION_MS
    assert DEFAULT_MIN_COMPACTION_LAG_MS <= DEFAULT_OP_RETENTION_MS


def test_topic_settings_follow_the_given_retentions() -> None:
    op = topic_settings(
        NAMES, NAMES.op, min_compaction_lag_ms=1000, half_retention_ms=2000, op_retention_ms=3000
    )
    half = topic_settings(NAMES, NAMES.half, half_retention_ms=2000)
    assert (op["retention.ms"], op["min.compaction.lag.ms"], half["retention.ms"]) == (
        "3000",
        "1000",
        "2000",
    )


@pytest.mark.parametrize(
    ("op", "half", "lag", "wanted"),
    [
        (14 * DAY_MS, 7 * DAY_MS, 7 * DAY_MS, None),
        (7 * DAY_MS, 7 * DAY_MS, 7 * DAY_MS, None),  # equal is enough for the check
        (-1, 7 * DAY_MS, 7 * DAY_MS, None),
        (-1, -1, 7 * DAY_MS, None),
        (6 * DAY_MS, 7 * DAY_MS, 1, "shorter than the half topic's retention.ms=604800000"),
        (14 * DAY_MS, -1, 1, "shorter than the half topic's retention.ms=-1"),
        (2 * DAY_MS, DAY_MS, 3 * DAY_MS, "shorter than its min.compaction.lag.ms=259200000"),
    ],
)
def test_the_op_retention_must_outlast_the_half_retention_and_the_compaction_lag(
    op: int, half: int, lag: int, wanted: str | None
) -> None:
    problem = op_retention_problem(op, half_retention_ms=half, min_compaction_lag_ms=lag)
    if wanted is None:
        assert problem is None
    else:
        assert problem is not None and wanted in problem


def test_the_required_op_retention_is_the_longest_bound_or_forever() -> None:
    assert required_op_retention_ms(14 * DAY_MS, 7 * DAY_MS, 30 * DAY_MS) == 30 * DAY_MS
    assert required_op_retention_ms(14 * DAY_MS, -1, 7 * DAY_MS) == -1


def test_topic_settings_refuse_an_op_retention_shorter_than_the_half_retention() -> None:
    with pytest.raises(ValueError, match=r"shorter than the half topic's retention\.ms=2000"):
        topic_settings(NAMES, NAMES.op, half_retention_ms=2000, op_retention_ms=1000)


def test_settings_default_to_the_documented_retentions() -> None:
    defaults = settings()
    assert (defaults.half_retention_ms, defaults.op_retention_ms) == (7 * DAY_MS, 14 * DAY_MS)


def test_settings_refuse_an_op_retention_shorter_than_the_half_retention_naming_the_fix() -> None:
    with pytest.raises(ConfigurationError) as refused:
        settings(half_retention_ms=30 * DAY_MS)
    message = str(refused.value)
    assert "op retention.ms=1209600000 is shorter than the half topic's retention.ms" in message
    assert "set OUTBOX_OP_RETENTION_MS (now 1209600000) to at least" in message
    assert "OUTBOX_HALF_RETENTION_MS" in message


def test_settings_refuse_an_op_retention_shorter_than_the_audit_window() -> None:
    with pytest.raises(ConfigurationError, match=r"min\.compaction\.lag\.ms=2592000000"):
        settings(min_compaction_lag_ms=30 * DAY_MS)


@pytest.mark.parametrize("name", ["half_retention_ms", "op_retention_ms"])
def test_settings_refuse_a_retention_that_is_neither_positive_nor_forever(name: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"{name}=0 must be positive, or -1"):
        settings(**{name: 0})


def test_settings_keep_records_forever_with_minus_one() -> None:
    assert settings(half_retention_ms=-1, op_retention_ms=-1).op_retention_ms == -1
    assert settings(op_retention_ms=-1).op_retention_ms == -1


def test_the_retentions_come_from_their_environment_variables() -> None:
    from_env = OutboxSettings.from_env(
        {
            "OUTBOX_BOOTSTRAP_SERVERS": "k:9092",
            "OUTBOX_PRODUCER_GROUP": "g",
            "OUTBOX_HALF_RETENTION_MS": str(3 * DAY_MS),
            "OUTBOX_OP_RETENTION_MS": str(21 * DAY_MS),
        }
    )
    assert (from_env.half_retention_ms, from_env.op_retention_ms) == (3 * DAY_MS, 21 * DAY_MS)

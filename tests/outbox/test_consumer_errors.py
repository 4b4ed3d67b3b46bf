"""A service's consumer errors said with what to grant, a repeat counted as librdkafka's own
repeated lines are (:mod:`outbox.consumer_errors`), on a fake clock."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError

from outbox.consumer_errors import ConsumerErrors
from outbox.log_repeats import REPEAT_WINDOW_S
from tests.fake_clock import Clock

GROUP = KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED)
TOPIC = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
GRANT = "grant the checker's principal Read on group cg"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def errors(clock: Clock) -> ConsumerErrors:
    return ConsumerErrors("checker", "cg", ("p-half", "p-op"), logging.getLogger("t"), clock)


def said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "t"]


def test_a_refused_group_names_the_grant_once_a_minute_with_the_count(
    errors: ConsumerErrors, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="t"):
        # Given a refusal said again every 2 s for two minutes (librdkafka says some on each retry)
        for _ in range(int(2 * REPEAT_WINDOW_S / 2) + 1):
            errors.report(GROUP)
            clock.now += 2
        # and once more, 2 s after the last one said, as the session ends
        errors.report(GROUP)
        errors.flush()
    # Then it was said once a minute, each time after the first with the count between, and
    # the count since the last one said at the end: every refusal said or counted
    lines = said(caplog)
    assert lines[0] == f"consumer error: {errors.last}" and lines[0].endswith(GRANT)
    assert "(29 like it in the 60.0 s before, not logged)" in lines[1]
    assert "(29 like it in the 60.0 s before, not logged)" in lines[2]
    assert "(held back: 1 like it in the 2.0 s after the one logged" in lines[3]
    assert len(lines) == 4
    assert errors.last is not None and errors.last.endswith(GRANT)


def test_a_count_held_for_an_error_that_stopped_is_logged_by_the_loop_a_minute_on(
    errors: ConsumerErrors, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="t"):
        # Given a refusal said, then 4 more counted in 8 s, then granted: no more come
        for _ in range(5):
            errors.report(GROUP)
            clock.now += 2
        # When the loop turns within the minute, and then after it
        errors.tick()
        assert len(said(caplog)) == 1
        clock.now += REPEAT_WINDOW_S
        errors.tick()
    # Then the count was logged without waiting for the session's end
    assert "(held back: 4 like it in the 8.0 s after the one logged" in said(caplog)[1]


def test_two_errors_that_alternate_are_each_said_once_a_minute(
    errors: ConsumerErrors, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="t"):
        # Given the group and a topic refused in turn, every second for 30 s
        for i in range(30):
            errors.report(GROUP if i % 2 else TOPIC, "p-op")
            clock.now += 1
        # When the member is assigned partitions
        errors.clear()
    # Then each was said once, and its count when the partitions changed
    lines = said(caplog)
    assert len(lines) == 4, lines
    assert lines[0].endswith("grant the checker's principal Read, Write and Describe on p-op")
    assert lines[1].endswith(GRANT)
    assert all("held back: 14 like it" in line for line in lines[2:])
    assert errors.last is None


def test_a_topic_refusal_the_consumer_names_no_topic_for_names_both(
    errors: ConsumerErrors, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="t"):
        text = errors.report(TOPIC)
    assert text.endswith("Read, Write and Describe on p-half and p-op")


def test_cleared_the_same_error_is_said_again(
    errors: ConsumerErrors, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="t"):
        errors.report(GROUP)
        errors.clear()
        errors.report(GROUP)
    assert len(said(caplog)) == 2


def test_an_error_with_no_acl_to_grant_is_said_as_it_came(
    errors: ConsumerErrors, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="t"):
        text = errors.report(KafkaError(KafkaError._MAX_POLL_EXCEEDED))
    assert "grant" not in text and said(caplog) == [f"consumer error: {text}"]


def test_a_refusal_holds_past_other_errors_until_the_group_answers(
    errors: ConsumerErrors, clock: Clock
) -> None:
    # Given the group refused once (librdkafka does not say it again), then other errors
    errors.report(GROUP)
    clock.now += 10 * REPEAT_WINDOW_S
    errors.report(KafkaError(KafkaError._TRANSPORT))
    # Then the refusal still says what to grant, the last error being another
    assert errors.refused is not None and errors.refused.endswith(GRANT)
    assert errors.last is not None and "grant" not in errors.last
    # and once the group answers (an assignment, even of nothing) it is over
    errors.clear()
    assert errors.refused is None


def test_an_error_with_no_acl_to_grant_is_no_refusal(errors: ConsumerErrors) -> None:
    errors.report(KafkaError(KafkaError._ALL_BROKERS_DOWN))
    assert errors.refused is None

"""A service's consumer errors said once with what to grant, a repeat counted
(:mod:`outbox.consumer_errors`), on a fake clock."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError

from outbox.consumer_errors import ConsumerErrors
from outbox.log_repeats import REPEAT_WINDOW_S
from tests.fake_clock import Clock

GROUP = KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED)
TOPIC = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def errors(clock: Clock) -> ConsumerErrors:
    return ConsumerErrors("checker", "cg", ("p-half", "p-op"), logging.getLogger("t"), clock)


def said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "t"]


def test_a_refused_group_names_the_grant_once_and_a_repeat_is_counted(
    errors: ConsumerErrors, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a JoinGroup refused again every 2 s for two windows
    with caplog.at_level(logging.WARNING, logger="t"):
        for _ in range(int(2 * REPEAT_WINDOW_S / 2) + 1):
            errors.report(GROUP)
            clock.now += 2
    # Then it was logged once a window, the second time with its count
    grant = "grant the checker's principal Read on group cg"
    assert len(said(caplog)) == 3 and said(caplog)[0].endswith(grant)
    assert "(29 like it in the 60 s before)" in said(caplog)[1]
    assert errors.last is not None and errors.last.endswith(grant)


def test_another_error_is_logged_at_once_naming_the_topic_refused(
    errors: ConsumerErrors, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="t"):
        errors.report(GROUP)
        errors.report(TOPIC, "p-op")
        errors.report(TOPIC)
    lines = said(caplog)
    assert len(lines) == 3
    assert lines[1].endswith("grant the checker's principal Read and Describe on p-op")
    assert lines[2].endswith("Read and Describe on p-half and p-op")


def test_cleared_the_same_error_is_said_again_and_readiness_has_none(
    errors: ConsumerErrors, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="t"):
        errors.report(GROUP)
        errors.clear()
        assert errors.last is None
        errors.report(GROUP)
    assert len(said(caplog)) == 2


def test_an_error_with_no_acl_to_grant_is_said_as_it_came(
    errors: ConsumerErrors, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="t"):
        text = errors.report(KafkaError(KafkaError._MAX_POLL_EXCEEDED))
    assert "grant" not in text and said(caplog) == [f"consumer error: {text}"]

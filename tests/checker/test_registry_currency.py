"""When the checker's view of the registry is current: the evidence, each dated no later than it
can be vouched for, the lapse, and the TTL of grace after it (no Kafka: a clock of the test's)."""

from __future__ import annotations

import logging

import pytest

from checker.registry_currency import MAX_ASK_INTERVAL_S, RegistryCurrency
from tests.fake_clock import Clock

TTL_S = 30.0  # current for 15 s; the end asked every 5 s


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def currency(clock: Clock) -> RegistryCurrency:
    return RegistryCurrency("p-registry", TTL_S, monotonic=clock)


def confirmed_by_eof(currency: RegistryCurrency, clock: Clock) -> None:
    currency.drained(clock.now)
    currency.reached_end()
    currency.update()
    assert currency.reason is None


def test_never_read_to_its_end_is_left_to_the_reader_to_say(currency: RegistryCurrency) -> None:
    currency.update()
    assert currency.reason is None  # LiveInstances says "not read to its end yet" itself


def test_an_end_event_taken_after_a_long_turn_is_dated_at_the_drain_before_it(
    currency: RegistryCurrency, clock: Clock
) -> None:
    confirmed_by_eof(currency, clock)
    # Given the loop's last drain of the queue 40 s ago (a long round since), and the broker
    # gone meanwhile: an end event fetched before then is taken from the queue only now
    clock.now += 40
    currency.reached_end()
    currency.update()
    # Then it vouches for the time of that drain, not for now: the view has lapsed
    assert currency.reason is not None
    assert "was last known read to its end 40 s ago" in currency.reason


def test_the_end_asked_confirms_once_reached_and_as_of_the_question(
    currency: RegistryCurrency, clock: Clock
) -> None:
    confirmed_by_eof(currency, clock)
    clock.now += 14
    assert currency.due()
    asked_at = currency.asking()
    # Given a busy registry: its end (50) past what was read (40) when the answer came
    assert not currency.answered(asked_at, 50, 40)
    assert not currency.due()
    clock.now += 3  # 17 s after the end event: current only through the question
    assert not currency.read_to(49)
    # When the reader reaches that end, records written since the question included
    assert currency.read_to(57)
    currency.update()
    # Then the view is current as of the question (3 s ago), not of now
    assert currency.reason is None
    clock.now += 12
    currency.update()
    assert currency.reason is None
    clock.now += 1
    currency.update()
    assert currency.reason is not None and "16 s ago" in currency.reason
    assert not currency.read_to(60)  # one answer confirms once


def test_an_end_below_what_was_read_confirms_nothing(
    currency: RegistryCurrency, clock: Clock
) -> None:
    """A topic made again under the reader: its offsets start over, below the reader's."""
    confirmed_by_eof(currency, clock)
    clock.now += 5
    assert not currency.answered(currency.asking(), 3, 40)
    assert not currency.read_to(40)
    clock.now += 11
    currency.update()
    assert currency.reason is not None


def test_a_lapse_is_logged_once_and_after_it_no_live_instance_is_unknown_for_a_ttl(
    currency: RegistryCurrency, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    confirmed_by_eof(currency, clock)
    with caplog.at_level(logging.INFO, logger="checker"):
        for _ in range(5):
            clock.now += 10
            currency.update()
        assert currency.reason is not None and "was last known read" in currency.reason
        # When the registry is read to its end again
        currency.drained(clock.now)
        currency.reached_end()
        currency.update()
        # Then for one TTL the heartbeats the producers could not write may still be coming
        assert currency.reason is not None and "is read again since 0 s" in currency.reason
        clock.now += TTL_S - 1
        currency.drained(clock.now)
        currency.reached_end()
        currency.update()
        assert currency.reason is not None and "read again" in currency.reason
        clock.now += 1
        currency.update()
        assert currency.reason is None
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    back = [r for r in caplog.records if "to its end again" in r.getMessage()]
    assert len(errors) == 1 and "does not know which producer instances" in errors[0].getMessage()
    assert len(back) == 1


def test_unanswered_questions_while_lapsed_are_asked_again_less_and_less_often(
    currency: RegistryCurrency, clock: Clock
) -> None:
    confirmed_by_eof(currency, clock)
    # A question unanswered while the view is current is asked again at the usual interval
    clock.now += 5
    assert currency.due()
    assert not currency.answered(currency.asking(), None, 0)
    clock.now += 5
    assert currency.due()
    # Once the view has lapsed, at 5, 10, 20, 40, then 60 s
    clock.now += 10
    currency.update()
    assert currency.reason is not None
    intervals = []
    for _ in range(7):
        waited = 0.0
        while not currency.due():
            clock.now += 0.5
            waited += 0.5
        intervals.append(waited)
        assert not currency.answered(currency.asking(), None, 0)
        currency.update()
    assert intervals[0] == 0.0  # due already
    assert intervals[1:] == [10.0, 20.0, 40.0, MAX_ASK_INTERVAL_S, 60.0, 60.0]
    # And an answer brings the usual interval back, before the lapse ends (its end not reached)
    assert not currency.answered(currency.asking(), 50, 40)
    currency.update()
    assert currency.reason is not None and "was last known read" in currency.reason
    clock.now += currency.ask_every_s
    assert currency.due()


def test_new_clients_are_asked_for_the_end_at_once_the_lapse_kept(
    currency: RegistryCurrency, clock: Clock
) -> None:
    confirmed_by_eof(currency, clock)
    # Given a lapse whose questions went unanswered, the next one due in 40 s
    clock.now += 20
    currency.update()
    for _ in range(3):
        while not currency.due():
            clock.now += 0.5
        assert not currency.answered(currency.asking(), None, 0)
    assert not currency.due()
    # When a new session renews the reader's clients
    currency.renewed()
    # Then the end is asked at once, and the view still says since when it is not known
    assert currency.due()
    currency.update()
    assert currency.reason is not None and "was last known read" in currency.reason


def test_while_lapsed_a_short_ttl_still_waits_5_s_between_unanswered_questions(
    clock: Clock,
) -> None:
    currency = RegistryCurrency("p-registry", 4.0, monotonic=clock)  # asked every 0.67 s
    confirmed_by_eof(currency, clock)
    clock.now += 3
    currency.update()
    assert currency.reason is not None
    assert currency.due()
    assert not currency.answered(currency.asking(), None, 0)
    clock.now += 4.5
    assert not currency.due()
    clock.now += 0.5
    assert currency.due()


def test_answers_are_kept_until_reached_and_the_latest_reached_dates_the_view(
    currency: RegistryCurrency, clock: Clock
) -> None:
    confirmed_by_eof(currency, clock)
    clock.now += 5
    first = currency.asking()
    assert not currency.answered(first, 50, 40) and currency.pending()
    clock.now += 5
    second = currency.asking()
    assert not currency.answered(second, 60, 45)
    clock.now += 4
    assert currency.read_to(52)  # the first end reached: confirmed as of the first question
    assert currency.pending()  # the second's end not yet
    clock.now += 7  # 21 s after the end event, 16 after the first question: lapsed
    assert currency.read_to(61)  # the second reached: as of it, 11 s ago
    assert not currency.pending()
    currency.update()
    assert currency.reason is None
    # An end below an earlier one (the topic made again) drops the answers before it
    assert not currency.answered(currency.asking(), 70, 62)
    assert not currency.answered(currency.asking(), 8, 62)  # below what was read: nothing
    assert not currency.answered(currency.asking(), 65, 62)
    assert currency.pending()
    assert currency.read_to(66)
    assert not currency.pending()


def test_a_long_backlog_read_at_start_is_no_lapse_and_awaits_nothing_after_it(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """A week of heartbeats read at start (the registry's newest segment is not compacted):
    the end event comes after minutes of full batches, dated at the last drain, long ago; the
    questions asked meanwhile are reached only at the end."""
    currency = RegistryCurrency("p-registry", TTL_S, monotonic=clock)
    with caplog.at_level(logging.INFO, logger="checker"):
        for i in range(24):  # two minutes of reading, a question every 5 s
            clock.now += 5
            at = currency.asking()
            assert not currency.answered(at, 1_000_000 + 1_000 * i, 10_000 * i)
        clock.now += 5
        currency.reached_end()  # dated at construction: the last drain
        currency.update()
        # Read to its end, evidence two minutes old: held, no lapse
        assert currency.reason is not None and "not yet confirmed" in currency.reason
        # When the reader reaches the questions' ends: as of the latest (the last 16 kept)
        assert currency.read_to(1_000_000 + 1_000 * 23)
        currency.update()
    assert currency.reason is None  # at once: no grace, nothing lapsed
    assert not [r for r in caplog.records if r.name == "checker"]


def test_a_refusal_is_no_lapse_and_awaits_no_heartbeats_after_it(
    currency: RegistryCurrency, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    confirmed_by_eof(currency, clock)
    with caplog.at_level(logging.INFO, logger="checker"):
        # Given the registry refused (an ACL taken away) for a minute
        for _ in range(6):
            clock.now += 10
            currency.update(readable=False)
            assert currency.reason is None  # the reader says "cannot be read" itself
        # When it is read to its end again
        currency.drained(clock.now)
        currency.reached_end()
        currency.update()
    # Then the view is current at once, and nothing was logged as a lapse
    assert currency.reason is None
    assert not [r for r in caplog.records if r.name == "checker"]

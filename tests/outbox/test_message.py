"""Topic validation (:func:`outbox.message.validate_topic`) remembers the topics it let through,
so a send to the same topic costs a set lookup, and the remembered answer is always the full
check's: an invalid or internal topic is refused however many valid ones came before. The
refusals through every public form are ``tests/outbox/test_bad_input.py``."""

from __future__ import annotations

import pytest

from outbox import message
from outbox.errors import InternalTopicError, InvalidTopicError
from outbox.message import MAX_VALID_TOPICS, validate_topic
from outbox.protocol.topics import TopicNames

OURS = TopicNames("__outbox")
OTHER = TopicNames("__other")


class Loose(str):
    """A valid topic whose equality and hash are its own: it claims to be "orders/eu"."""

    def __eq__(self, other: object) -> bool:
        return type(other) is str and str.__eq__(other, "orders/eu")

    def __hash__(self) -> int:
        return hash("orders/eu")


def test_a_str_subclass_is_checked_but_not_remembered() -> None:
    assert str(validate_topic(Loose("ok-topic"), OURS)) == "ok-topic"
    with pytest.raises(InvalidTopicError, match="contains '/'"):
        validate_topic("orders/eu", OURS)


def test_a_valid_topic_is_let_through_again_and_bad_ones_stay_refused() -> None:
    assert validate_topic("orders", OURS) == validate_topic("orders", OURS) == "orders"
    for _ in range(2):
        with pytest.raises(InvalidTopicError, match="contains '/'"):
            validate_topic("orders/eu", OURS)
        with pytest.raises(InvalidTopicError, match="must be a str"):
            validate_topic(b"orders", OURS)


def test_a_topic_internal_under_one_prefix_is_refused_there_whatever_another_let_through() -> None:
    assert validate_topic("__outbox-op", OTHER) == "__outbox-op"  # not internal for __other
    with pytest.raises(InternalTopicError, match="internal prefix"):
        validate_topic("__outbox-op", OURS)


def test_more_topics_than_it_remembers_are_all_still_checked() -> None:
    for n in range(MAX_VALID_TOPICS * 2 + 3):
        assert validate_topic(f"tenant-{n}", OURS) == f"tenant-{n}"
        assert (
            len(message._valid_topics) <= MAX_VALID_TOPICS
        )  # read only: what it holds stays bounded
    with pytest.raises(InternalTopicError):
        validate_topic("__outbox-half", OURS)
    assert validate_topic("tenant-0", OURS) == "tenant-0"

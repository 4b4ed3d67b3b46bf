"""A session's clients are each closed whatever the one before raised (outbox.closing)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from confluent_kafka import KafkaError, KafkaException

from outbox.closing import close_each

log = logging.getLogger("test-close-each")


def _closers(raises: dict[int, Exception]) -> tuple[list[int], list[Callable[[], None]]]:
    """Four closers that note their index when called and raise as ``raises`` says."""
    closed: list[int] = []

    def closer(index: int) -> Callable[[], None]:
        def close() -> None:
            closed.append(index)
            if index in raises:
                raise raises[index]

        return close

    return closed, [closer(i) for i in range(4)]


def test_a_client_whose_close_raises_a_kafka_error_leaves_the_rest_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lost = KafkaException(KafkaError(KafkaError._FATAL, "the group was lost"))
    closed, closers = _closers({0: lost, 2: lost})
    with caplog.at_level(logging.WARNING, logger=log.name):
        close_each(closers, log)
    assert closed == [0, 1, 2, 3]
    assert ["the group was lost" in r.getMessage() for r in caplog.records] == [True] * 2


def test_any_other_error_is_raised_once_the_rest_are_closed() -> None:
    bug, later = RuntimeError("a bug"), ValueError("another")
    closed, closers = _closers({1: bug, 3: later})
    with pytest.raises(RuntimeError) as raised:
        close_each(closers, log)
    assert raised.value is bug  # the first one, after every closer ran
    assert closed == [0, 1, 2, 3]


def test_a_client_never_made_is_skipped() -> None:
    closed, closers = _closers({})
    close_each([None, closers[0], None, closers[1]], log)
    assert closed == [0, 1]

"""The round writer's ``init_transactions``: retried while the coordinator settles, and each
attempt counted as the loop turning, so a slow coordinator is not taken for a stuck checker."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from checker.writer import init_transactions


class Coordinator:
    """A producer whose ``init_transactions`` fails ``failures`` times first."""

    def __init__(self, failures: int, code: int = KafkaError._TIMED_OUT) -> None:
        self.failures = failures
        self.code = code
        self.calls = 0

    def init_transactions(self, timeout: float) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise KafkaException(KafkaError(self.code, "coordinator not ready", retriable=True))


def test_each_attempt_counts_as_progress_until_one_succeeds() -> None:
    producer, turns = Coordinator(failures=3), []
    init_transactions(producer, 0.1, progress=lambda: turns.append(1))  # type: ignore[arg-type]
    assert producer.calls == 4
    assert len(turns) == 4


def test_it_gives_up_after_its_attempts_with_the_last_error() -> None:
    producer, turns = Coordinator(failures=99), []
    with pytest.raises(KafkaException):
        init_transactions(producer, 0.1, attempts=2, progress=lambda: turns.append(1))  # type: ignore[arg-type]
    assert producer.calls == len(turns) == 2

"""A checker frozen past its session timeout and woken after another took its partitions must not
write a decision: its writes are fenced as the relay's are.

Checker A (a child process) asks about a transaction and is frozen (SIGSTOP) while its second
check, the one after which it would give the transaction up, is answered UNKNOWN. Checker B
takes over, carries A's check count on, and the producer now answers COMMIT: B writes COMMIT.
Then A wakes with its answer in hand. Unfenced, it would give the committed transaction up
after B's COMMIT: a GIVEN_UP op and a dead letter for work that committed.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest

from checker import Checker
from outbox import LocalTransactionState, MessageView, OutboxProducer, OutboxSettings
from outbox.checks.listener import FunctionResolver
from outbox.protocol import OpState
from tests.checker.processes import CheckerProcess, write_transactions
from tests.checker.test_checker import SECRET, Background, checker_settings, wait_for
from tests.kafka_helpers import unique
from tests.producer_fixtures import Topics
from tests.relay.test_relay import read_topic

pytestmark = [pytest.mark.integration, pytest.mark.processes]


class Answers:
    """UNKNOWN, then UNKNOWN slowly (A freezes meanwhile), then COMMIT."""

    def __init__(self) -> None:
        self.calls = 0
        self.second_asked = threading.Event()

    def __call__(self, msg: MessageView) -> LocalTransactionState:
        self.calls += 1
        if self.calls == 1:
            return LocalTransactionState.UNKNOWN
        if self.calls == 2:
            self.second_asked.set()
            time.sleep(2)  # A is frozen before the answer reaches it
            return LocalTransactionState.UNKNOWN
        return LocalTransactionState.COMMIT


def test_a_frozen_checker_woken_after_another_took_over_writes_no_decision(
    kafka_bootstrap: str, outbox_settings: OutboxSettings, topics: Topics, tmp_path: Path
) -> None:
    names = outbox_settings.topics
    answers = Answers()
    group = unique("checker")
    with OutboxProducer(outbox_settings) as endpoint:
        endpoint.serve_checks(resolver=FunctionResolver(answers), secret=SECRET)
        [txn_id] = write_transactions(
            kafka_bootstrap, names, 1, partitions=3, group="orders", decided=False
        )
        a = CheckerProcess(
            kafka_bootstrap,
            names.prefix,
            group,
            "a",
            tmp_path / "a.log",
            check_max=2,
            kafka__session_timeout_ms=6000,
        ).start()
        b: Background | None = None
        try:
            # Given A asking the second time, frozen before the answer reaches it
            assert answers.second_asked.wait(60), a.tail()
            a.signal(signal.SIGSTOP)
            # When B takes over (after A's session times out) and the producer says COMMIT
            b = Background(
                Checker(
                    checker_settings(
                        kafka_bootstrap,
                        names.prefix,
                        group_id=group,
                        instance_id="b",
                        check_max=2,
                        kafka={"session.timeout.ms": 6000},
                    )
                )
            )
            wait_for(lambda: [o.state for o in topics.ops() if o.txn_id == txn_id] != [], 60)
            assert [o.state for o in topics.ops() if o.txn_id == txn_id] == [OpState.COMMIT]
            # and A wakes with its UNKNOWN answer, its second
            a.signal(signal.SIGCONT)
            time.sleep(8)  # its round, fenced, and a new session
        finally:
            if b is not None:
                b.stop()
            a.stop()
    # Then the op topic holds B's COMMIT alone, and nothing was dead-lettered
    assert [o.state for o in topics.ops() if o.txn_id == txn_id] == [OpState.COMMIT]
    assert read_topic(kafka_bootstrap, names.dead_letter) == []
    # and A said why its round was not written (refused before it or by the broker)
    assert "this round is not written" in a.tail() or "did not commit" in a.tail(), a.tail()

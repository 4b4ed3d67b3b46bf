"""The whole pipeline for end-to-end guarantee tests: a real topic, a relay, a checker.

A scenario ends with what a user would look at: the rows in the database and the records a
``read_committed`` consumer reads from the real topic, which must agree (both or neither).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from checker import Checker
from outbox import OutboxProducer
from outbox.protocol.states import TERMINAL_STATES
from tests.checker.test_checker import checker_and_relay
from tests.kafka_helpers import create_topic, unique
from tests.producer_fixtures import Topics
from tests.relay.test_relay import read_topic


@contextmanager
def ops_lost(producer: OutboxProducer, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every op record the producer writes inside the block is lost, as when its process dies
    between its local commit and its op (RocketMQ's end-transaction is one-way too)."""

    async def lost(op: object) -> bool:
        return False

    with monkeypatch.context() as patch:
        patch.setattr(producer.kafka, "send_op", lambda op: False)
        patch.setattr(producer.kafka, "send_op_async", lost)
        yield


@dataclass
class Pipeline:
    bootstrap: str
    topic: str
    topics: Topics
    checker: Checker

    def delivered(self) -> Counter[str]:
        """Values (UTF-8) a read_committed consumer reads from the real topic now."""
        return Counter(m.value().decode() for m in read_topic(self.bootstrap, self.topic))

    def decided(self, txn_ids: Iterable[str], timeout: float = 90) -> dict[str, str]:
        """Wait until each transaction has a terminal op; its first one's state."""
        wanted = set(txn_ids)
        deadline = time.monotonic() + timeout
        while True:
            first: dict[str, str] = {}
            for op in self.topics.ops():
                if op.txn_id in wanted and op.state in TERMINAL_STATES:
                    first.setdefault(op.txn_id, op.state.value)
            if len(first) == len(wanted):
                return first
            assert time.monotonic() < deadline, f"undecided: {sorted(wanted - set(first))}"
            time.sleep(0.5)

    def settle(self, expected: Callable[[], set[str]], timeout: float = 60) -> Counter[str]:
        """Wait until everything ``expected`` names was delivered, then a little longer (a
        duplicate or phantom would show up then); what was delivered."""
        deadline = time.monotonic() + timeout
        while not set(self.delivered()) >= expected():
            assert time.monotonic() < deadline, (
                f"not delivered: {sorted(expected() - set(self.delivered()))}"
            )
            time.sleep(0.5)
        time.sleep(2)
        return self.delivered()

    def agree(self, rows: Iterable[str], committed: list[str], refused: list[str]) -> None:
        """Every ``committed`` order has its row and its message once; every ``refused`` one
        neither (``rows``: the order ids in the database)."""
        rows = set(rows)
        assert set(committed) <= rows
        assert not set(refused) & rows
        delivered = self.settle(lambda: set(committed))
        assert {o: delivered[o] for o in committed + refused} == {
            **dict.fromkeys(committed, 1),
            **dict.fromkeys(refused, 0),
        }


@contextmanager
def pipeline(bootstrap: str, topics: Topics, **checker: object) -> Iterator[Pipeline]:
    """A fresh real topic, a relay and a checker (1 s timeout and interval) on ``topics``."""
    topic = unique("orders")
    create_topic(bootstrap, topic, partitions=3)
    with checker_and_relay(bootstrap, topics.settings.topic_prefix, **checker) as running:
        yield Pipeline(bootstrap, topic, topics, running)

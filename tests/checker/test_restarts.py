"""A checker's restart costs what is pending, not the topics' history; its check counts survive.

Each checker runs as a child process (``python -m checker``), stopped and started again as a
deployment would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from checker.assignment import progress_metadata
from outbox import (
    LocalTransactionState,
    MessageView,
    OutboxProducer,
    OutboxSettings,
    ensure_topics,
)
from outbox.checks.listener import FunctionResolver
from outbox.protocol import OpState
from outbox.protocol.topics import TopicNames
from tests.checker.processes import CheckerProcess, write_transactions
from tests.checker.test_checker import SECRET, wait_for
from tests.kafka_helpers import unique
from tests.producer_fixtures import Topics

pytestmark = [pytest.mark.integration, pytest.mark.processes]


class Counting:
    """An endpoint's answers: ``answer`` to every check, counting them and timing the first."""

    def __init__(self, answer: LocalTransactionState) -> None:
        self.answer = answer
        self.asked: dict[str, int] = {}
        self.first_at: float | None = None
        self.lock = threading.Lock()

    def __call__(self, msg: MessageView) -> LocalTransactionState:
        with self.lock:
            self.asked[msg.transaction_id] = self.asked.get(msg.transaction_id, 0) + 1
            if self.first_at is None:
                self.first_at = time.monotonic()
        return self.answer


@pytest.fixture
def endpoint(outbox_settings: OutboxSettings) -> Iterator[tuple[OutboxProducer, Counting]]:
    answers = Counting(LocalTransactionState.UNKNOWN)
    with OutboxProducer(outbox_settings) as producer:
        producer.serve_checks(resolver=FunctionResolver(answers), secret=SECRET)
        yield producer, answers


def test_a_checker_restarted_every_few_seconds_still_gives_up_after_check_max_checks(
    kafka_bootstrap: str,
    outbox_settings: OutboxSettings,
    topics: Topics,
    endpoint: tuple[OutboxProducer, Counting],
    tmp_path: Path,
) -> None:
    # Given a transaction its producers answer UNKNOWN forever, and a checker restarted every
    # 4 s that checks every second and gives up after 6 checks: no life of it sees 6 checks
    _, answers = endpoint
    names = outbox_settings.topics
    [txn_id] = write_transactions(
        kafka_bootstrap, names, 1, partitions=3, group="orders", decided=False
    )
    group = unique("checker")
    restarts = 0
    deadline = time.monotonic() + 90
    while not [o for o in topics.ops() if o.txn_id == txn_id]:
        assert time.monotonic() < deadline, f"not given up after {restarts} restarts"
        checker = CheckerProcess(
            kafka_bootstrap,
            names.prefix,
            group,
            f"c{restarts}",
            tmp_path / "checker.log",
            check_max=6,
        ).start()
        time.sleep(4)
        checker.stop()
        restarts += 1
    # Then it was given up, its counts carried from life to life (RocketMQ's check times)
    [op] = [o for o in topics.ops() if o.txn_id == txn_id]
    assert op.state is OpState.GIVEN_UP and "after 6 checks" in (op.reason or "")
    # a life of 4 s checking once a second sees at most 4 checks: 6 took more than one life
    assert restarts >= 2
    # a count is saved with each round; one answered just before a stop may be asked again
    assert 6 <= answers.asked[txn_id] <= 6 + restarts


def commit_progress(
    bootstrap: str, names: TopicNames, group: str, *, partitions: int, floor_ms: int
) -> None:
    """Commit ``group``'s positions at the ends of the half and op partitions, with the floor
    metadata a checker stores (:func:`checker.assignment.progress_metadata`)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        offsets = []
        for p in range(partitions):
            for topic in (names.half, names.op):
                _, end = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                metadata = progress_metadata(floor_ms) if topic == names.op else ""
                offsets.append(TopicPartition(topic, p, end, metadata=metadata))
        consumer.commit(offsets=offsets, asynchronous=False)
    finally:
        consumer.close()


def _restarted(
    bootstrap: str, prefix: str, decided: int, tmp_path: Path, answers: Counting
) -> tuple[float, int, float]:
    """``decided`` transactions decided long ago, a checker that read them and stopped, then
    100 pending ones: the restarted checker's time to its first check, its peak RSS (KiB), and
    what it knew pending when it first said it was ready."""
    names = OutboxSettings(
        bootstrap_servers=bootstrap, producer_group="orders", topic_prefix=prefix
    ).topics
    write_transactions(bootstrap, names, decided, partitions=3, group="orders", decided=True)
    group = unique("checker")
    # A checker that read them and stopped: the progress it commits with each round (reading
    # 1,000,000 decisions once is a first start's cost, not a restart's; a checker's own
    # progress commits are tested by the restart test above)
    time.sleep(11)  # decided long ago: past the checker's clock slack (10 s) when it stopped
    commit_progress(bootstrap, names, group, partitions=3, floor_ms=int(time.time() * 1000))
    pending = write_transactions(bootstrap, names, 100, partitions=3, group="orders", decided=False)
    answers.first_at = None
    started = time.monotonic()
    second = CheckerProcess(
        bootstrap, prefix, group, "second", tmp_path / f"second-{decided}.log"
    ).start()
    try:
        while second.get("/readyz")[0] != 200:
            assert time.monotonic() - started < 600, second.tail()
            time.sleep(0.05)
        known = second.metric("outbox_checker_pending")
        wait_for(lambda: answers.first_at is not None, timeout=120)
        assert answers.first_at is not None
        took = answers.first_at - started
        wait_for(lambda: all(t in answers.asked for t in pending), timeout=60)
        return took, second.peak_rss_kib(), known or 0.0
    finally:
        second.stop()


def test_restart_time_and_memory_follow_the_pending_transactions_not_the_decided_history(
    kafka_bootstrap: str, endpoint: tuple[OutboxProducer, Counting], tmp_path: Path
) -> None:
    # Given two deployments with 100 pending transactions each, one with 10,000 decided ones
    # in its history and one with 1,000,000
    _, answers = endpoint
    small = _restarted(
        kafka_bootstrap, endpoint[0].settings.topic_prefix, 10_000, tmp_path, answers
    )
    other = unique("__outbox-test")
    with OutboxProducer(
        OutboxSettings(
            bootstrap_servers=kafka_bootstrap,
            producer_group="orders",
            topic_prefix=other,
            partitions=3,
        )
    ) as producer:
        ensure_topics(producer.settings)
        producer.serve_checks(resolver=FunctionResolver(answers), secret=SECRET)
        large = _restarted(kafka_bootstrap, other, 1_000_000, tmp_path, answers)
    print(
        f"restart to first check: {small[0]:.2f} s (10k decided), {large[0]:.2f} s (1M); "
        f"peak RSS {small[1] / 1024:.0f} MiB, {large[1] / 1024:.0f} MiB"
    )
    # Then the restart to the first check and the memory are within a small factor
    assert large[0] <= 3 * small[0] + 2, (small, large)
    assert large[1] <= 1.5 * small[1], (small, large)
    # and each said it was ready only once it knew every pending transaction
    assert small[2] == 100 and large[2] == 100

"""What outlives a checker session: a failed session is replaced, the registry's view kept.

Which producer instances are live is the checker's knowledge, not its group member's: a session
ending (a round's write failing, its member out of the group) must not forget what the registry
said, or since when it could not be read (``tests/checker/test_registry_outage.py``: a session
ending during a registry outage). The reader's Kafka clients are made anew with each session, as
the session's own are, so that a client broken without a word is not kept for good; it reads on
from where the last one stopped.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

import outbox.kafka_clients
from checker import Checker
from checker.writer import RoundFailed, RoundWriter
from outbox import OutboxSettings
from outbox.kafka_logging import log_to_python
from outbox.registry import Heartbeat
from tests.checker.test_checker import Background, checker_settings, wait_for

pytestmark = pytest.mark.integration

URL = "http://127.0.0.1:1/check"


class RecordingConsumer(Consumer):
    """A real consumer that keeps the offsets it was assigned at."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(log_to_python(config))
        self.assigned_at: list[int] = []

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned_at += [tp.offset for tp in partitions]
        super().assign(partitions)


@pytest.fixture
def registry_readers(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[RecordingConsumer]]:
    """The registry readers' consumers, in the order they were made."""
    made: list[RecordingConsumer] = []
    real = outbox.kafka_clients.consumer

    def consumer(config: dict[str, Any]) -> Consumer:
        if config.get("group.id") != "outbox-checker-registry":
            return real(config)
        made.append(RecordingConsumer(config))
        return made[-1]

    monkeypatch.setattr(outbox.kafka_clients, "consumer", consumer)
    yield made


def test_a_new_session_keeps_the_registry_view_and_reads_on_with_new_clients(
    kafka_bootstrap: str,
    outbox_settings: OutboxSettings,
    monkeypatch: pytest.MonkeyPatch,
    registry_readers: list[RecordingConsumer],
) -> None:
    armed: list[str] = []
    real_write = RoundWriter.write

    def fail_when_armed(self: RoundWriter, *args: Any) -> None:
        if armed:
            armed.clear()
            raise RoundFailed("the round's Kafka transaction did not commit: a test's")
        real_write(self, *args)

    monkeypatch.setattr(RoundWriter, "write", fail_when_armed)
    first = Heartbeat(outbox_settings, URL, version="test")
    checker = Checker(checker_settings(kafka_bootstrap, outbox_settings.topic_prefix))
    running = Background(checker)
    try:
        # Given a checker that has read an instance's heartbeats
        wait_for(lambda: checker.ready()[0])
        reader = checker.instances
        assert reader is not None
        wait_for(lambda: len(reader.live("orders")) == 1)
        # When a round's write fails (the periodic commit of the read positions)
        armed.append("fail")
        wait_for(lambda: checker.sessions == 2 and len(registry_readers) == 2)
        # Then the new session knows the instance at once, from the same view
        assert checker.instances is reader
        assert [r.check_url for r in reader.live("orders")] == [URL]
        # reading on with a new consumer from where the old one was, not from the start
        old, new = registry_readers
        assert old.assigned_at == [0]
        assert new.assigned_at[0] > 0
        with pytest.raises(RuntimeError, match="closed"):
            old.consume(1, 0)
        wait_for(lambda: checker.ready()[0])
        assert checker.sessions == 2
        # And what comes after is read: a second instance's heartbeat, the first one's tombstone
        second = Heartbeat(outbox_settings, "http://127.0.0.1:2/check", version="test")
        try:
            first.close()
            wait_for(
                lambda: [r.check_url for r in reader.live("orders")] == ["http://127.0.0.1:2/check"]
            )
            assert checker.ready()[0], checker.ready()
        finally:
            second.close()
    finally:
        first.close()
        running.stop()
    assert not running.thread.is_alive()
    assert checker.instances is None  # closed as the checker stopped
    with pytest.raises(RuntimeError, match="closed"):
        registry_readers[-1].consume(1, 0)

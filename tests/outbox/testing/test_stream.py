"""outbox.testing's StreamWriter on a real broker: the half offsets a transaction records are
where its half records are, or the flush says why they are not known."""

from __future__ import annotations

from typing import Any

import pytest

from outbox.testing.stream import StreamWriter
from tests.kafka_helpers import reported_without_offset, unique

pytestmark = pytest.mark.integration


class FirstHalfWithoutOffset:
    """The writer's producer, handing the first half record's real delivery report over
    without its offset, as librdkafka does for a retried produce the broker had written."""

    def __init__(self, producer: Any, half_topic: str) -> None:
        self._producer = producer
        self._half_topic = half_topic
        self.armed = True

    def produce(self, topic: str, **kwargs: Any) -> None:
        report = kwargs.get("on_delivery")
        if self.armed and topic == self._half_topic and report is not None:
            self.armed = False
            kwargs["on_delivery"] = reported_without_offset(report)
        self._producer.produce(topic, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)


def test_half_offsets_are_known_after_the_flush(kafka_bootstrap: str) -> None:
    writer = StreamWriter(kafka_bootstrap, prefix=unique("__outbox-stream"), partitions=3)
    try:
        txn = writer.begin([("orders", b"k", b"a"), ("orders", b"k", b"b")])
        writer.flush()
        offsets = txn.half_offsets()
        assert len(set(offsets)) == 2 and all(isinstance(o, int) and o >= 0 for o in offsets)
    finally:
        writer.close()


def test_a_half_record_acknowledged_without_its_offset_fails_the_flush_naming_it(
    kafka_bootstrap: str,
) -> None:
    writer = StreamWriter(kafka_bootstrap, prefix=unique("__outbox-stream"), partitions=3)
    writer.producer = FirstHalfWithoutOffset(writer.producer, writer.topics.half)  # type: ignore[assignment]
    try:
        txn = writer.begin([("orders", b"k", b"a"), ("orders", b"k", b"b")])
        with pytest.raises(RuntimeError, match="acknowledged without its offset"):
            writer.flush()
        # nothing unknown was recorded as an offset: an op built from it would name None
        assert list(txn.offsets) == [1] and isinstance(txn.offsets[1], int)
    finally:
        writer.close()

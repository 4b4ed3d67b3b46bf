"""``BrokerClock``: the broker's time from the stamps of the records read, never ahead of it."""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    TIMESTAMP_NOT_AVAILABLE,
)

from outbox.broker_clock import BrokerClock

#: The host's wall clock: 10 minutes ahead of the broker's (ms below are the broker's).
AHEAD_S = 600.0
BROKER_MS = 1_800_000_000_000


@dataclass
class Host:
    """A host's clocks: monotonic seconds, and a wall clock ``AHEAD_S`` ahead of the broker."""

    monotonic_s: float = 1000.0

    def wall(self) -> float:
        return BROKER_MS / 1000 + AHEAD_S + (self.monotonic_s - 1000.0)

    def monotonic(self) -> float:
        return self.monotonic_s

    def clock(self) -> BrokerClock:
        return BrokerClock(wall=self.wall, monotonic=self.monotonic)


@dataclass
class Record:
    """What ``consume()`` hands over, as far as the clock reads it."""

    kind: int
    stamp: int

    def timestamp(self) -> tuple[int, int]:
        return self.kind, self.stamp


def test_before_any_broker_stamp_it_is_the_host_clock() -> None:
    host = Host()
    assert host.clock().now_ms() == int(host.wall() * 1000)


def test_it_counts_from_the_newest_stamp_read_plus_the_time_since() -> None:
    # Given a record stamped by the broker, read 50 ms after it was appended
    host = Host()
    clock = host.clock()
    clock.saw(BROKER_MS - 50)
    # When 2 s pass on the host's monotonic clock
    host.monotonic_s += 2
    # Then the broker's time is 2 s later than the stamp: the host's 10 minutes count for nothing
    assert clock.now_ms() == BROKER_MS - 50 + 2000


def test_an_older_stamp_read_later_does_not_move_it_back() -> None:
    # Given a fresh stamp, then (a partition read behind) one an hour older, a second later
    host = Host()
    clock = host.clock()
    clock.saw(BROKER_MS)
    host.monotonic_s += 1
    clock.saw(BROKER_MS - 3_600_000)
    # Then the clock still counts from the fresh one; a newer one moves it forward
    assert clock.now_ms() == BROKER_MS + 1000
    clock.saw(BROKER_MS + 1500)
    assert clock.now_ms() == BROKER_MS + 1500


def test_a_batch_counts_its_newest_broker_stamp_and_ignores_producer_stamps() -> None:
    host = Host()
    clock = host.clock()
    # A topic stamped by its producers (CreateTime) says nothing about the broker's clock
    clock.read([Record(TIMESTAMP_CREATE_TIME, BROKER_MS + 999_000)])  # type: ignore[list-item]
    assert clock.now_ms() == int(host.wall() * 1000)
    # A batch's newest broker stamp counts, wherever it is (a partition read behind comes after
    # it); an event without a stamp (a partition's end) is passed
    batch = [
        Record(TIMESTAMP_LOG_APPEND_TIME, BROKER_MS - 10),
        Record(TIMESTAMP_LOG_APPEND_TIME, BROKER_MS - 3_600_000),
        Record(TIMESTAMP_CREATE_TIME, BROKER_MS + 999_000),
        Record(TIMESTAMP_NOT_AVAILABLE, -1),
    ]
    clock.read(batch)  # type: ignore[arg-type]
    assert clock.now_ms() == BROKER_MS - 10
    clock.read([])
    assert clock.now_ms() == BROKER_MS - 10

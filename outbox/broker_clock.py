"""The broker's time, as the records a service reads tell it, for the relay's and the checker's
deadlines.

The half, op and registry topics stamp each record with the broker's clock (``LogAppendTime``),
and the deadlines measured on them - a pending transaction's put-back after
``put_back_after_s``, its checks, a producer instance's heartbeat going stale - compare those
stamps with "now". Taken from the service's own wall clock, a host whose clock runs ahead of the
broker's sees every record as older than it is: by 10 minutes, the relay puts back each pending
transaction at every batch (its copies, stamped afresh, are "old" again as soon as they are
read), and the checker finds no producer's heartbeat fresh, so it asks nobody and gives up on
every transaction whose op was lost. A clock behind keeps dead instances "live" as long.

:class:`BrokerClock` counts from the newest broker stamp read instead: that stamp plus the
monotonic time elapsed since it was read. A record is stamped before it is read, so this is
never ahead of the clock of the broker that stamped the newest record - a deadline is never
early by more than two brokers' clocks differ - and is behind it by as much as the reader lags
the newest record (a service starting on topics quiet for an hour counts from their last record
until a newer one arrives; the registry's heartbeats, every few seconds, keep the checker's
current). The host's wall clock is used only until a broker stamp has been read, when nothing
read is waiting on a deadline yet.

One thread feeds a clock (the service's loop) and any may read it: the estimate only ever
moves forward, from None to a number, so a reader sees an old value or a newer one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Message


class BrokerClock:
    """Milliseconds on the broker's clock, estimated from the stamps of the records read.

    Args:
        wall: the host's clock (s), used before any broker stamp was read.
        monotonic: the host's monotonic clock (s), which measures the time since a read.
    """

    def __init__(
        self,
        *,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._wall = wall
        self._monotonic = monotonic
        #: The broker's ms minus the monotonic ms, at the newest stamp read; None before one.
        self._offset_ms: float | None = None

    def saw(self, timestamp_ms: int) -> None:
        """A record stamped ``timestamp_ms`` by the broker was just read."""
        offset = timestamp_ms - self._monotonic() * 1000
        if self._offset_ms is None or offset > self._offset_ms:
            self._offset_ms = offset

    def read(self, messages: Sequence[Message]) -> None:
        """Records just consumed: the newest broker stamp (``LogAppendTime``) among them counts
        (a batch mixes partitions, some read behind the others). A producer's stamp
        (``CreateTime``, a topic not made by ``kafka-outbox topics ensure``) is the producer's
        clock, and is not counted."""
        newest = -1
        for msg in messages:
            kind, stamp = msg.timestamp()
            if kind == TIMESTAMP_LOG_APPEND_TIME and stamp > newest:
                newest = stamp
        if newest >= 0:
            self.saw(newest)

    def now_ms(self) -> int:
        """The broker's clock now: never ahead of it (see the module's docstring)."""
        if self._offset_ms is None:
            return int(self._wall() * 1000)
        return int(self._offset_ms + self._monotonic() * 1000)

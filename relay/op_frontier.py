"""How far, in broker time, a partition's ops are known: the clock put-back is measured on.

A pending transaction is put back when it has stayed undecided for ``put_back_after_s``. The
relay's clock (:class:`outbox.broker_clock.BrokerClock`) follows the newest record read on any
partition of either topic; while the relay catches up after downtime it reads a half partition
ahead of its op partition, and by that clock the whole backlog looks undecided for as long as
the relay was down, though the ops deciding it wait unread a few offsets further on. Put back
then, every one of them is copied for nothing (a relay down for an hour copied its hour's
backlog once), the copies hold each op back until they are read again, and the checker may
take a copy whose original it never read for a transaction still to be decided.

So each partition measures its pending transactions against its op partition:

* at its end (the consumer's end-of-partition event, after skipping any commit markers), every
  op written until now was read: the relay's clock;
* otherwise, the stamp of the newest op read there (the broker's, ``LogAppendTime``, on topics
  made by ``topics ensure``, so in offset order; on a topic stamped by its producers,
  their clocks'): an op written later has not been read;
* an op read but waiting at the head of the queue (for half records or put-back copies the
  reader has not reached) is not handled, nor is any behind it: its stamp bounds the time too
  (a transaction whose op waits behind it is not put back unless its op came
  ``put_back_after_s`` after its halves);
* nothing yet in this life of the state: no put-back until the reader learns either.

A transaction is thus put back when a relay keeping up would have put it back. Not exactly:
once read to its end, a partition counts as read up to the clock until the next op arrives, so
while its op fetches stall (a leader away) transactions decided by ops not fetched yet are put
back as before; and its end is the last stable offset (the reader is ``read_committed``), so
ops committed behind a Kafka transaction left open on the op partition are not read either
until that transaction ends (``transaction.timeout.ms`` at most).
"""

from __future__ import annotations


class OpFrontier:
    """The broker time up to which one op partition's ops are known read."""

    __slots__ = ("_at_end", "_read_ms")

    def __init__(self) -> None:
        #: The broker stamp of the newest op read (None: none in this life of the state).
        self._read_ms: int | None = None
        #: Whether the reader is at the partition's end: nothing read since its last EOF.
        self._at_end = False

    def read(self, timestamp_ms: int | None) -> None:
        """An op stamped ``timestamp_ms`` (None: no broker stamp) was read: more may follow."""
        self._at_end = False
        if timestamp_ms is not None and (self._read_ms is None or timestamp_ms > self._read_ms):
            self._read_ms = timestamp_ms

    def reached_end(self) -> None:
        """The reader reached the partition's end (its last stable offset): every op written
        so far was read, but those behind a Kafka transaction still open there."""
        self._at_end = True

    def reassigned(self) -> None:
        """The partition was let go of and given back: ops may have come meanwhile, unread."""
        self._at_end = False

    def known_to(self, now_ms: int) -> int | None:
        """The broker time up to which every op is read, as of ``now_ms``; None: unknown."""
        if self._at_end:
            return now_ms
        if self._read_ms is None:
            return None
        return min(self._read_ms, now_ms)

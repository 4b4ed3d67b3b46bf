"""Whether the checker's view of the registry is current: the topic read to its end lately.

An instance is live while its last heartbeat in the registry is younger than the TTL, and "no
live instance" is what gives a group's transactions up. That is only true of a view read to the
registry's end lately. When the registry's partition loses its leader while the rest of Kafka
serves (its one replica's broker away), nothing more is read; every instance ages past the TTL
in a view that no longer moves, and the checker used to go on checking and counting toward
``no_producer_timeout_s``, then gave up live producers' committed transactions.

:class:`RegistryCurrency` keeps when the registry was last known read to its end, from two
kinds of evidence, each dated no later than it can be vouched for:

- an end-of-partition event: librdkafka queued it after the last consume call that emptied the
  queue began (an event taken from the queue after a long turn of the loop may have been
  fetched long before), so it is dated then;
- the partition's leader asked for its end (every third of :attr:`current_s`): once the reader
  has reached that end, every record written before the question was read, so it is dated when
  asked. On a busy registry, where librdkafka rarely sees an empty fetch at the end, this is what
  keeps the view current.

The view is current for :attr:`current_s` (half the TTL) after that: an instance heartbeating
at least twice a TTL (every 5 s against 30 by default) cannot age out of a view still current.
Past it, the view has lapsed: the checker holds its checks. When it is current again, the
producers' heartbeats, which they could not write meanwhile either, take a while to come back:
"no live instance" stays unknown for one TTL more. Only a view that was current lapses: read
to its end after a start or a refusal with older evidence (a long backlog read in full
batches), it is held until a question confirms it, no lapse logged and no grace after it.

Only the checker's loop thread feeds it and calls :meth:`update`; the worker threads read
:attr:`reason`, a string replaced whole.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("checker")

#: Answered questions kept until the reader reaches their ends (the oldest dropped first).
MAX_PENDING = 16
#: While the view has lapsed, the end is asked at growing intervals up to this (s): each
#: unanswered question costs the loop its timeout and a fresh watermark client.
MAX_ASK_INTERVAL_S = 60.0


class RegistryCurrency:
    """When the registry was last known read to its end, and whether that is recent enough.

    Args:
        topic: the registry topic, for the messages.
        ttl_s: the registry's TTL: the view is current for half of it.
        monotonic: the host's monotonic clock (s).
    """

    def __init__(
        self, topic: str, ttl_s: float, *, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.topic = topic
        self.ttl_s = ttl_s
        #: How long after the registry was last known read to its end the view is current.
        self.current_s = ttl_s / 2
        #: How often the end is asked while the view is current.
        self.ask_every_s = self.current_s / 3
        self._now = monotonic
        self._read_through: float | None = None  # last known read to its end (None: never)
        self._drained_at = monotonic()  # when the last consume call that emptied the queue began
        self._asked_at = float("-inf")  # when the end was last asked
        self._asked: list[tuple[float, int]] = []  # (when, end) answered, not yet reached
        self._current_once = False  # current at least once since it was last readable
        self._misses = 0  # questions unanswered in a row
        self._lapsed = False  # the view lapsed, and is not current again yet
        self._back_at: float | None = None  # when it was current again after a lapse
        #: Why which instances are live is not known from this view (None: it is known).
        self.reason: str | None = None

    # -- evidence ---------------------------------------------------------------------------

    def drained(self, began: float) -> None:
        """A consume call that began at ``began`` (monotonic s) emptied the queue."""
        self._drained_at = began

    def reached_end(self) -> None:
        """An end-of-partition event was taken from the queue (before :meth:`drained` is told
        of the call that took it)."""
        self._through(self._drained_at)

    def forget(self) -> None:
        """The reader starts over (refused, assigned again): an answer asked before says
        nothing of what it will read."""
        self._asked = []

    def renewed(self) -> None:
        """The reader reads on with new clients (a new session's): what was asked before is
        forgotten, and the end is asked at once - the old client's questions going unanswered
        say nothing of the new one's."""
        self.forget()
        self._misses, self._asked_at = 0, float("-inf")

    def due(self) -> bool:
        """Whether the end should be asked now: every :attr:`ask_every_s`, and while the view
        has lapsed and questions go unanswered at doubling intervals from 5 s up to
        :data:`MAX_ASK_INTERVAL_S` (heartbeats coming back end a lapse as well)."""
        interval = self.ask_every_s
        if self._lapsed and self._misses:
            interval = min(MAX_ASK_INTERVAL_S, max(interval, 5.0) * 2 ** (self._misses - 1))
        return self._now() - self._asked_at >= interval

    def asking(self) -> float:
        """The end is asked now: when (monotonic s), for :meth:`answered`."""
        self._asked_at = self._now()
        return self._asked_at

    def answered(self, asked_at: float, end: int | None, next_offset: int) -> bool:
        """The leader's end (None: no answer) to a question asked at ``asked_at``; the reader's
        next offset now. Returns whether that confirms the view read to its end."""
        if end is None:
            self._misses += 1
            return False
        self._misses = 0
        if end < next_offset:
            return False  # read past the end: the topic made again under the reader, which
            # starts over from its beginning (auto.offset.reset): not confirmed until then
        if self._asked and end < self._asked[-1][1]:
            self._asked.clear()  # an end below an earlier one: the topic made again
        self._asked = [*self._asked[-(MAX_PENDING - 1) :], (asked_at, end)]
        return self.read_to(next_offset)

    def pending(self) -> bool:
        """Whether an end was answered that the reader has not reached yet."""
        return bool(self._asked)

    def read_to(self, next_offset: int) -> bool:
        """The reader's next offset now. Returns whether it has reached an end asked, which
        confirms the view read to its end as of the latest such question (a reader catching up
        on a long backlog reaches the ends of questions asked while it read)."""
        reached = [at for at, end in self._asked if end <= next_offset]
        if not reached:
            return False
        self._through(max(reached))
        self._asked = [(at, end) for at, end in self._asked if end > next_offset]
        return True

    def _through(self, at: float) -> None:
        if self._read_through is None or at > self._read_through:
            self._read_through = at

    # -- the verdict ------------------------------------------------------------------------

    def update(self, *, readable: bool = True) -> None:
        """Whether the view is current now (:attr:`reason`); its lapse logged, and its end.

        Not ``readable`` (Kafka refuses the registry, or it is not read to its end since the
        refusal): the reader says so itself, and a refusal is no lapse - the producers could
        write their heartbeats meanwhile, so none is awaited after it."""
        if self._read_through is None or not readable:
            self.reason, self._current_once = None, False
            return
        now = self._now()
        age = now - self._read_through
        if age > self.current_s and not self._current_once:
            # read to its end after a start or a refusal, the evidence older than the span (a
            # long backlog read): held until a question confirms it, no lapse - nothing was
            # current to lapse, and nothing is awaited after it
            self.reason = (
                f"the registry topic {self.topic} is read to its end, not yet confirmed "
                f"within {self.current_s:.0f} s"
            )
            return
        if age > self.current_s:
            self.reason = (
                f"the registry topic {self.topic} was last known read to its end {age:.0f} s "
                "ago (its partition without a leader, or its broker not answering)"
            )
            if not self._lapsed:
                self._lapsed, self._back_at = True, None
                log.error(
                    "%s: the checker does not know which producer instances are live, so it "
                    "neither checks nor gives up transactions of groups it knows no live "
                    "instance of until it reads the registry again",
                    self.reason,
                )
            return
        self._current_once = True
        if self._lapsed:
            self._lapsed, self._back_at = False, now
            log.info(
                "the checker reads the registry topic %s to its end again; groups with no "
                "live instance are known as such once the producers' heartbeats had %.0f s "
                "to come back",
                self.topic,
                self.ttl_s,
            )
        if self._back_at is not None and now - self._back_at < self.ttl_s:
            self.reason = (
                f"the registry topic {self.topic} is read again since {now - self._back_at:.0f} "
                "s after a lapse: the heartbeats the producers could not write meanwhile may "
                "still be coming"
            )
            return
        self._back_at = None
        self.reason = None

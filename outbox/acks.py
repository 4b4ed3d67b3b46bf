"""Waiting for Kafka's acknowledgements of records handed to librdkafka.

librdkafka reports each delivery on its poll thread; a :class:`Waiter` counts the reports of one
batch down and then wakes whoever waits: a thread on its event, or an asyncio task on a future
completed from that thread with ``loop.call_soon_threadsafe`` (:func:`future_setter`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable

from confluent_kafka import KafkaError, Message


class Waiter:
    """Counts down delivery reports of one batch; keeps offsets in send order."""

    def __init__(self, n: int, on_done: Callable[[], None] | None = None) -> None:
        self.offsets: list[int | None] = [None] * n
        self.errors: list[KafkaError] = []
        self._left = n
        self._lock = threading.Lock()
        self.done = threading.Event()
        #: When the last report came (``time.perf_counter()``); 0.0 until then. A sender that
        #: worked meanwhile (the evidence row) still measures the acknowledgement itself.
        self.done_at = 0.0
        self._on_done = on_done

    def callback(self, i: int) -> Callable[[KafkaError | None, Message], None]:
        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            with self._lock:
                if err is not None:
                    self.errors.append(err)
                else:
                    self.offsets[i] = msg.offset()
                self._left -= 1
                last = self._left == 0
                if last:
                    self.done_at = time.perf_counter()
                    self.done.set()
            if last and self._on_done is not None:
                self._on_done()

        return on_delivery


def future_setter(future: asyncio.Future[None]) -> Callable[[], None]:
    """A callback, run on a librdkafka thread, that completes ``future`` on its loop."""
    loop = future.get_loop()

    def done() -> None:
        # RuntimeError: the loop was closed meanwhile, and nobody awaits any more
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_complete, future)

    return done


def _complete(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def backoff_s(attempt: int) -> float:
    """The pause before retry ``attempt`` (1 = the first retry) of a half send."""
    return float(min(2.0, 0.1 * 2 ** (attempt - 1)))

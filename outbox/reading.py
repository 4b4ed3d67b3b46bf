"""Reading a batch of records without waiting out the timeout.

confluent-kafka's ``Consumer.consume(n, timeout)`` returns when ``n`` records are in hand or
``timeout`` has passed - not when the first arrives. Under a light load a batch is never full,
so every call waits its whole timeout and a record that arrived at its start waits with it:
``consume(2000, 0.05)`` delays a lone record by 25 ms on average and 50 at worst.
:func:`consume_ready` returns what has arrived at once, else waits for the first record only.
"""

from __future__ import annotations

from confluent_kafka import Consumer, Message


def consume_ready(consumer: Consumer, most: int, timeout: float) -> list[Message]:
    """Up to ``most`` records: those already fetched, without waiting; when there are none, the
    first to arrive within ``timeout`` and whatever arrived with it. Callbacks (rebalances,
    errors, statistics) are served as ``consume()`` serves them."""
    ready: list[Message] = consumer.consume(most, 0)
    if ready or timeout <= 0:
        return ready
    first = consumer.poll(timeout)
    if first is None:
        return []
    return [first, *consumer.consume(most - 1, 0)] if most > 1 else [first]

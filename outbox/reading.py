"""Reading a batch of records without waiting out the timeout.

confluent-kafka's ``Consumer.consume(n, timeout)`` returns when ``n`` records are in hand or
``timeout`` has passed - not when the first arrives. Under a light load a batch is never full,
so every call waits its whole timeout and a record that arrived at its start waits with it:
``consume(2000, 0.05)`` delays a lone record by 25 ms on average and 50 at worst.
:func:`consume_ready` returns what has arrived at once, else waits for the first record only.
"""

from __future__ import annotations

from confluent_kafka import Consumer, Message

from outbox.errors import ConfigurationError

#: confluent-kafka's own bound on one ``consume()``.
MOST = 1_000_000


def consume_ready(consumer: Consumer, most: int, timeout: float) -> list[Message]:
    """Up to ``most`` records: those already fetched, without waiting; when there are none, the
    first to arrive within ``timeout`` and whatever arrived with it. ``timeout`` is read as
    ``consume()`` reads it: 0 does not wait, a negative one waits for ever. Callbacks
    (rebalances, errors, statistics) are served as ``consume()`` serves them.

    Raises:
        ConfigurationError: ``most`` is not between 1 and 1,000,000.
    """
    if not 1 <= most <= MOST:
        raise ConfigurationError(f"most={most!r} must be between 1 and {MOST:,} records")
    ready: list[Message] = consumer.consume(most, 0)
    if ready or timeout == 0:
        return ready
    first = consumer.poll(timeout)
    if first is None:
        return []
    return [first, *consumer.consume(most - 1, 0)] if most > 1 else [first]

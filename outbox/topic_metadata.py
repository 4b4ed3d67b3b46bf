"""A broker's topic listing, read again when the connection it went out on drops.

librdkafka's metadata call (``list_topics``) gives up at the first connection that closes under
its request, however long its timeout: measured with a proxy that closed every connection at its
first Metadata request for 1.5 s, the call failed with ``_TRANSPORT`` after 0.06-0.26 s of a 10 s
timeout, in each of 3 runs. A connection closes like that when a broker restarts, or when a
proxy or load balancer in between drops it. The producer reads this listing before its process's
first transaction, so that transaction failed with :class:`~outbox.errors.HalfSendError` although
the broker answered a moment later. So such a failure is tried again, after the pauses of a half
send's retries, while the next pause still fits in the caller's timeout.

A broker that does not answer at all fails the read as before, once the timeout has passed:
librdkafka then waits out the whole timeout for a broker to come up and fails with the same
``_TRANSPORT``, with no time left to retry.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ClusterMetadata  # type: ignore[attr-defined]

from outbox.acks import backoff_s

log = logging.getLogger("outbox")

#: librdkafka's errors of a read another attempt may pass: the connection closed under it, or
#: no broker was up at that moment. (Its own timeout is not one: it used the time up. A topic's
#: error comes back inside the listing, not raised.)
TRANSIENT = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN})


class MetadataClient(Protocol):
    """A confluent-kafka Producer, Consumer or AdminClient."""

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata: ...


def transient(error: object) -> bool:
    """Whether a read that failed with ``error`` (librdkafka's) may pass if tried again."""
    return isinstance(error, KafkaError) and error.code() in TRANSIENT


def read_topic_metadata(
    client: MetadataClient,
    timeout_s: float,
    *,
    what: str = "the broker",
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> ClusterMetadata:
    """Every topic the client may see, tried again on a :func:`transient` failure while the
    next pause fits in ``timeout_s`` (from this call). The first retry is logged as a warning
    naming ``what`` (where the client reads from), later ones at DEBUG. A ``timeout_s`` of 0
    or less is passed on as it is, with no retry (librdkafka: no wait, or no limit).

    All topics, not one by name: asking for one by name may auto-create it with 1 partition.

    Raises:
        KafkaException: the last attempt's error: not transient, or no time left to retry.
    """
    if timeout_s <= 0:
        return client.list_topics(timeout=timeout_s)
    deadline = clock() + timeout_s
    attempt = 1
    while True:
        try:
            return client.list_topics(timeout=max(0.001, deadline - clock()))
        except KafkaException as err:
            error = err.args[0] if err.args else None
            pause = backoff_s(attempt)
            if not transient(error) or clock() + pause >= deadline:
                raise
            log.log(
                logging.WARNING if attempt == 1 else logging.DEBUG,
                "reading topic metadata from %s failed (%s); trying again within %.1f s",
                what,
                error,
                max(0.0, deadline - clock()),
            )
        sleep(pause)
        attempt += 1

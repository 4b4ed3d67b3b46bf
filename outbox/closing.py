"""Closing several parts, each whatever the one before it raised: a relay or checker session's
Kafka clients, an outbox producer's check endpoint, heartbeat and clients.

A relay or checker session holds several librdkafka clients. Closing them in a row stops at the
first that raises - a consumer's close fails on a group it lost, or on a broker that is gone -
and the ones after it stay connected (and keep logging a stopped broker's refused reconnects)
until the cyclic collector frees the session, some time later.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from confluent_kafka import KafkaException


def close_each(
    closers: Iterable[Callable[[], object] | None],
    log: logging.Logger,
    what: str = "the session's Kafka clients",
) -> None:
    """Call every closer in order (``None`` is skipped: a client never made); ``what`` names
    them in the warnings.

    A ``KafkaException`` is what a client's close raises when the broker or the group is gone:
    it is logged and the next closer runs. Anything else is a bug, not a broker's state: the
    rest are still closed, then the first such error is raised.
    """
    failed: Exception | None = None
    for close in closers:
        if close is None:
            continue
        try:
            close()
        except KafkaException as err:
            log.warning("closing %s: %s", what, err)
        except Exception as err:  # closed the rest first, raised below
            log.warning("closing %s: %r", what, err)
            failed = failed or err
    if failed is not None:
        raise failed

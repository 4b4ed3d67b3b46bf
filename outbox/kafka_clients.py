"""Every Kafka client the library, the relay and the checker make, made here.

Two things hold for each of them, so they are done in one place rather than at each call:

- librdkafka's log goes to Python logging (:func:`outbox.kafka_logging.log_to_python`);
- in a process forked after ``outbox`` was imported, no client is made that could never connect
  (:func:`outbox.fork_checks.check_if_forked`): a worker forked while a thread of its parent held
  a lock librdkafka needs raises :class:`~outbox.errors.ForkedWithLockHeldError` instead, whether
  it uses a producer made before the fork, makes its own, or starts its check endpoint.

The CLI's clients are its own (one short-lived command, never forked, its log to stderr).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from outbox.fork_checks import check_if_forked
from outbox.kafka_logging import log_to_python


def producer(config: Mapping[str, Any]) -> Producer:
    """A producer with ``config`` (librdkafka's settings).

    Raises:
        ForkedWithLockHeldError: this forked process can never connect a Kafka client.
    """
    check_if_forked()
    return Producer(log_to_python(config))


def consumer(config: Mapping[str, Any]) -> Consumer:
    """A consumer with ``config`` (librdkafka's settings).

    Raises:
        ForkedWithLockHeldError: this forked process can never connect a Kafka client.
    """
    check_if_forked()
    return Consumer(log_to_python(config))


def admin(config: Mapping[str, Any]) -> AdminClient:
    """An admin client with ``config`` (librdkafka's settings).

    Raises:
        ForkedWithLockHeldError: this forked process can never connect a Kafka client.
    """
    check_if_forked()
    return AdminClient(log_to_python(config))

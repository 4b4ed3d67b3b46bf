"""The states a transaction can be in, in RocketMQ's words where RocketMQ has one."""

from __future__ import annotations

from enum import StrEnum


class LocalTransactionState(StrEnum):
    """What the local (DB) transaction did: RocketMQ's ``LocalTransactionState``."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"


class OpState(StrEnum):
    """The decision an op record carries. The first terminal op of a transaction wins."""

    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    #: The checker gave up after its maximum number of checks; the messages are dead-lettered.
    GIVEN_UP = "GIVEN_UP"


class DecidedBy(StrEnum):
    """Who wrote an op record."""

    PRODUCER = "producer"
    CHECKER = "checker"

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
    #: Not terminal: an operator put a given-up transaction back to be checked again
    #: (``kafka-outbox resume``); its ``half.offsets`` name the re-appended copies. The next
    #: terminal op decides the transaction.
    RESUMED = "RESUMED"


#: States that decide a transaction. The first terminal op (after the latest RESUMED) wins.
TERMINAL_STATES = frozenset({OpState.COMMIT, OpState.ROLLBACK, OpState.GIVEN_UP})


class DecidedBy(StrEnum):
    """Who wrote an op record."""

    PRODUCER = "producer"
    CHECKER = "checker"

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


class CheckBy(StrEnum):
    """What answers a check of a transaction, written on its half records by the producer.

    The answer must come from where the transaction's outcome is recorded: the evidence table
    for the decorator and context-manager forms, the application's
    ``check_local_transaction`` for ``TransactionalProducer`` (its local work leaves no
    evidence row, so fencing it would answer ROLLBACK for work that committed).
    """

    #: The evidence row (fenced resolution); records without the header mean this.
    EVIDENCE = "evidence"
    #: The producer group's ``TransactionListener.check_local_transaction``.
    LISTENER = "listener"

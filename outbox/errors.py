"""Every error the library raises, in one tree.

::

    OutboxError
    ├── ConfigurationError          bad settings or decorator options
    │   ├── WrongFormError
    │   ├── AutocommitSessionError  the session commits each statement on its own
    │   ├── ExternalTransactionError  the session's commit would not commit
    │   └── MultipleDatabasesError  the transaction's writes span databases
    ├── ProtocolError               a record on an internal topic we cannot read
    │   └── UnknownSchemaVersionError
    ├── InvalidMessageError         bad input to send(), refused before anything is sent
    │   ├── InvalidTopicError
    │   │   └── InternalTopicError
    │   ├── MessageTooLargeError
    │   ├── SerializationError
    │   ├── InvalidHeaderError
    │   └── DelayNotSupportedError
    ├── NoActiveTransactionError    send() outside a transaction
    ├── ProducerClosedError
    ├── ForkedWithLockHeldError     forked while a parent thread held a lock: no Kafka here
    │   ├── ForkedDuringNameLookupError  the parent was looking up a host name
    │   └── ForkedDuringRandomSeedError  the parent was seeding librdkafka's random numbers
    ├── HalfSendError               half message not acknowledged; the local transaction did not run
    ├── TransactionFencedError      a check fenced this transaction id; the DB rolled back
    ├── CommitInsideTransactionError  session.commit() inside an outbox transaction
    │   └── TransactionStatementError   a COMMIT/ROLLBACK/END statement inside one
    ├── SendRolledBackError         a rollback undid work a half message was sent in
    ├── TopicMismatchError          an internal topic exists with the wrong settings
    ├── MigrationHistoryError       the outbox's revisions are recorded in the other version table
    └── KafkaOperationError         another Kafka failure (librdkafka error in ``.kafka_error``)

Kafka errors are chained (``raise ... from err``), so ``err.__cause__.args[0].retriable()`` and
friends stay reachable; :class:`KafkaOperationError` and :class:`HalfSendError` also expose the
``KafkaError`` directly.
"""

from __future__ import annotations

from typing import Any


class OutboxError(Exception):
    """Raised for any failure of this project; catch it to catch them all."""


class ConfigurationError(OutboxError):
    """Raised when settings or decorator options are missing, unknown or invalid."""


class SendNotAwaitedError(OutboxError):
    """Raised at the commit of an asyncio transaction in which a send (``outbox.send()``,
    ``txn.send()`` or their batch forms) was never awaited, or a send started as a task was
    still waiting to run when the block ended (its message was never sent); the transaction is
    rolled back."""


class WrongFormError(ConfigurationError):
    """Raised when a synchronous session meets the asyncio form, or an asyncio session (or
    coroutine function) the synchronous form, or an asyncio transaction's send is called from a
    thread with no event loop running; the message names the form that fits."""


class ProtocolError(OutboxError):
    """Raised when a half or op record cannot be decoded."""


class UnknownSchemaVersionError(ProtocolError):
    """Raised when a record carries a schema version this code does not know; never guessed at."""


class InvalidMessageError(OutboxError):
    """Raised when send() is given something it cannot send; nothing was sent."""


class InvalidTopicError(InvalidMessageError):
    """Raised when a topic name breaks Kafka's naming rules."""


class InternalTopicError(InvalidTopicError):
    """Raised when a message is addressed to one of the outbox's own internal topics."""


class MessageTooLargeError(InvalidMessageError):
    """Raised when a serialized value is over the configured maximum."""


class TransactionTooLargeError(InvalidMessageError):
    """Raised when a send would give a transaction more messages than its op record can name
    (:attr:`outbox.OutboxSettings.max_messages_per_transaction`); nothing of that send was
    sent."""


class SerializationError(InvalidMessageError):
    """Raised when a key, value or header has a type that cannot be sent without a serializer."""


class InvalidHeaderError(InvalidMessageError):
    """Raised when a header name is reserved or not a string."""


class DelayNotSupportedError(InvalidMessageError):
    """Raised when delayed or scheduled delivery is requested: transactional messages have none."""


class NoActiveTransactionError(OutboxError):
    """Raised when send() is called outside a transaction."""


class ProducerClosedError(OutboxError):
    """Raised when a closed producer is used."""


class KafkaOperationError(OutboxError):
    """Raised when Kafka refuses or fails an operation; ``kafka_error`` is librdkafka's error."""

    def __init__(self, message: str, kafka_error: Any = None) -> None:
        super().__init__(message)
        self.kafka_error = kafka_error

    def retriable(self) -> bool:
        return bool(self.kafka_error is not None and self.kafka_error.retriable())


class HalfSendError(KafkaOperationError):
    """Raised when a half message was not acknowledged; the local transaction was not committed.

    ``reason`` says how a send failed, as ``outbox_producer_half_send_failures_total`` counts
    it: ``timeout`` (no acknowledgement in time: is the broker up?), ``refused`` (the broker or
    librdkafka refused a record, ``kafka_error`` says why), ``queue_full`` (librdkafka's local
    queue) or ``error`` (anything else, e.g. ``produce()`` raised for an unknown partition).
    """

    TIMEOUT = "timeout"
    REFUSED = "refused"
    QUEUE_FULL = "queue_full"
    ERROR = "error"

    def __init__(self, message: str, kafka_error: Any = None, *, reason: str = ERROR) -> None:
        super().__init__(message, kafka_error)
        self.reason = reason


class ForkedWithLockHeldError(OutboxError):
    """Raised in a forked process that can never connect a Kafka client: it was forked while
    another thread of its parent (a Kafka client's, connecting) held a lock the child's clients
    need, which the child inherits held, with no thread left to release it. None is made;
    nothing was sent. Replace the process (:mod:`outbox.fork_checks`)."""


class ForkedDuringNameLookupError(ForkedWithLockHeldError):
    """The lock is glibc's, held inside ``getaddrinfo``: no host name can be looked up here."""


class ForkedDuringRandomSeedError(ForkedWithLockHeldError):
    """The lock is that of the process-wide random generator of the OpenSSL librdkafka links:
    no thread of a Kafka client made here can seed its random numbers (to connect)."""


class TransactionFencedError(OutboxError):
    """Raised when a check fenced this transaction id before it committed; the DB rolled back."""


class CommitInsideTransactionError(OutboxError):
    """Raised when code inside an outbox transaction calls ``session.commit()``; refused before
    the database commits, and the transaction is rolled back."""


class TransactionStatementError(CommitInsideTransactionError):
    """Raised when code inside an outbox transaction runs a statement that ends the database
    transaction (``COMMIT``, ``END``, ``ROLLBACK`` but not to a savepoint, ``ABORT``,
    ``PREPARE TRANSACTION``) over the evidence row's connection; refused before it runs, and
    the transaction is rolled back."""


class TransactionEndedError(OutboxError):
    """Raised when the session's database transaction was committed or rolled back under it,
    through its ``Connection`` (``session.connection().commit()``, ``.rollback()``,
    ``.close()``), which no session event reports: the outbox cannot tell which, so the
    checker decides from the evidence row (what committed before it is delivered with its
    messages), and the rest rolls back."""


class AutocommitSessionError(ConfigurationError):
    """Raised when an outbox transaction's session commits each statement on its own
    (``AUTOCOMMIT``), before the transaction's first statement runs; raised again at its end if
    caught, and the transaction rolls back (a message already sent is never delivered)."""


class ExternalTransactionError(ConfigurationError):
    """Raised when an outbox transaction's session is in a database transaction it does not own
    (joined to a ``Connection``'s, or through a savepoint), so its commit would not commit; the
    outbox transaction rolls back."""


class MultipleDatabasesError(ConfigurationError):
    """Raised when an outbox transaction would commit writes in a database other than its
    evidence row's (a horizontally sharded session, or a session with several binds that wrote
    to a second one): each database commits on its own, so the messages could announce writes
    that never commit; the outbox transaction rolls back."""


class SendRolledBackError(OutboxError):
    """Raised when a rollback inside an outbox transaction undid work a half message was sent
    in; the whole transaction is rolled back (a sent message cannot be taken back)."""


class TopicMismatchError(OutboxError):
    """Raised when an internal topic exists with a partition count or policy we cannot work with."""


class MigrationHistoryError(OutboxError):
    """Raised by an outbox migration about to run in one Alembic version table while the
    database records the outbox's revisions in the other one (``outbox_alembic_version`` of
    ``outbox.migrations.upgrade()``, or the application's ``alembic_version`` when its history
    includes the outbox's); nothing was migrated, and the message says how to pick one history."""


#: How much of an offending value an error message quotes (characters of its ``repr``).
QUOTED_CHARS = 80


def quoted(value: object, limit: int = QUOTED_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters, saying how much was left out.

    Messages name the value they refuse, but a malformed field read off a topic can be
    megabytes (``repr`` of binary bytes is four times their size): quoted whole, it would flood
    the log and make the dead letter carrying the message too large for its topic.
    """
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit:,} more characters)"

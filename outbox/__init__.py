"""A transactional outbox for Apache Kafka with RocketMQ's half-message semantics.

A local database transaction and the messages sent inside it either both happen or neither.
"""

from __future__ import annotations

import importlib
from typing import Any

from outbox.async_transaction import AsyncOutboxTransaction
from outbox.consumer import Deduplicator
from outbox.decorator import INJECTED, configure, transactional
from outbox.errors import (
    AutocommitSessionError,
    CommitInsideTransactionError,
    ConfigurationError,
    DelayNotSupportedError,
    ExternalTransactionError,
    ForkedDuringNameLookupError,
    ForkedDuringRandomSeedError,
    ForkedWithLockHeldError,
    HalfSendError,
    InternalTopicError,
    InvalidHeaderError,
    InvalidMessageError,
    InvalidTopicError,
    KafkaOperationError,
    MessageTooLargeError,
    MigrationHistoryError,
    MultipleDatabasesError,
    NoActiveTransactionError,
    OutboxError,
    ProducerClosedError,
    ProtocolError,
    SendNotAwaitedError,
    SendRolledBackError,
    SerializationError,
    TopicMismatchError,
    TransactionEndedError,
    TransactionFencedError,
    TransactionStatementError,
    TransactionTooLargeError,
    UnknownSchemaVersionError,
    WrongFormError,
)
from outbox.message import Message, MessageView, json_serializer
from outbox.producer import OutboxProducer
from outbox.protocol.states import LocalTransactionState
from outbox.pruning import PruneResult, prune_evidence
from outbox.sending import Sending, current_transaction, send, send_batch
from outbox.settings import OutboxSettings
from outbox.topics import ensure_topics
from outbox.transaction import HalfCoordinates, OutboxTransaction
from outbox.transactional_producer import (
    AsyncTransactionalProducer,
    AsyncTransactionListener,
    SendStatus,
    TransactionalProducer,
    TransactionListener,
    TransactionSendResult,
)

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """``outbox.migrations`` right after ``import outbox``, without importing Alembic for every
    producer that never migrates from code."""
    if name == "migrations":
        return importlib.import_module("outbox.migrations")
    raise AttributeError(f"module 'outbox' has no attribute {name!r}")


__all__ = [
    "INJECTED",
    "AsyncOutboxTransaction",
    "AsyncTransactionListener",
    "AsyncTransactionalProducer",
    # Errors
    "AutocommitSessionError",
    "CommitInsideTransactionError",
    "ConfigurationError",
    "Deduplicator",
    "DelayNotSupportedError",
    "ExternalTransactionError",
    "ForkedDuringNameLookupError",
    "ForkedDuringRandomSeedError",
    "ForkedWithLockHeldError",
    # Producing
    "HalfCoordinates",
    "HalfSendError",
    "InternalTopicError",
    "InvalidHeaderError",
    "InvalidMessageError",
    "InvalidTopicError",
    "KafkaOperationError",
    "LocalTransactionState",
    "Message",
    "MessageTooLargeError",
    "MessageView",
    "MigrationHistoryError",
    "MultipleDatabasesError",
    "NoActiveTransactionError",
    "OutboxError",
    "OutboxProducer",
    "OutboxSettings",
    "OutboxTransaction",
    "ProducerClosedError",
    "ProtocolError",
    "PruneResult",
    "SendNotAwaitedError",
    "SendRolledBackError",
    "SendStatus",
    "Sending",
    "SerializationError",
    "TopicMismatchError",
    "TransactionEndedError",
    "TransactionFencedError",
    "TransactionListener",
    "TransactionSendResult",
    "TransactionStatementError",
    "TransactionTooLargeError",
    "TransactionalProducer",
    "UnknownSchemaVersionError",
    "WrongFormError",
    "configure",
    "current_transaction",
    "ensure_topics",
    "json_serializer",
    "prune_evidence",
    "send",
    "send_batch",
    "transactional",
]

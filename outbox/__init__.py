"""A transactional outbox for Apache Kafka with RocketMQ's half-message semantics.

A local database transaction and the messages sent inside it either both happen or neither.
"""

from __future__ import annotations

from outbox.consumer import Deduplicator
from outbox.decorator import configure, current_transaction, send, send_batch, transactional
from outbox.errors import (
    CommitInsideTransactionError,
    ConfigurationError,
    DelayNotSupportedError,
    HalfSendError,
    InternalTopicError,
    InvalidHeaderError,
    InvalidMessageError,
    InvalidTopicError,
    KafkaOperationError,
    MessageTooLargeError,
    NoActiveTransactionError,
    OutboxError,
    ProducerClosedError,
    ProtocolError,
    SendRolledBackError,
    SerializationError,
    TopicMismatchError,
    TransactionFencedError,
    UnknownSchemaVersionError,
)
from outbox.message import Message, MessageView, json_serializer
from outbox.producer import OutboxProducer
from outbox.protocol.states import LocalTransactionState
from outbox.pruning import PruneResult, prune_evidence
from outbox.settings import OutboxSettings
from outbox.topics import ensure_topics
from outbox.transaction import HalfCoordinates, OutboxTransaction
from outbox.transactional_producer import (
    SendStatus,
    TransactionalProducer,
    TransactionListener,
    TransactionSendResult,
)

__version__ = "0.1.0"

__all__ = [
    # Errors
    "CommitInsideTransactionError",
    "ConfigurationError",
    "Deduplicator",
    "DelayNotSupportedError",
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
    "NoActiveTransactionError",
    "OutboxError",
    "OutboxProducer",
    "OutboxSettings",
    "OutboxTransaction",
    "ProducerClosedError",
    "ProtocolError",
    "PruneResult",
    "SendRolledBackError",
    "SendStatus",
    "SerializationError",
    "TopicMismatchError",
    "TransactionFencedError",
    "TransactionListener",
    "TransactionSendResult",
    "TransactionalProducer",
    "UnknownSchemaVersionError",
    "configure",
    "current_transaction",
    "ensure_topics",
    "json_serializer",
    "prune_evidence",
    "send",
    "send_batch",
    "transactional",
]

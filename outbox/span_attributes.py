"""What the outbox's spans are called and carry: span names, attribute keys, and the attributes
of the producer's spans (docs/tracing.md lists them).

Separate from :mod:`outbox.otel` and :mod:`outbox.tracing` so that the relay's and the checker's
spans and the tests read one spelling of each; importing this module imports nothing of
OpenTelemetry.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.util.types import AttributeValue

    from outbox.protocol.half import HalfMessage
    from outbox.protocol.op import OpRecord
    from outbox.transaction import OutboxTransaction

#: The instrumentation scope of every span the outbox records.
SCOPE = "kafka-outbox"

# Span names (docs/tracing.md).
SEND = "outbox.send"
SEND_BATCH = "outbox.send_batch"
COMMIT = "outbox.commit"
OP = "outbox.op"
EXECUTE = "outbox.execute_local_transaction"

# Attributes: OpenTelemetry's messaging conventions where one fits, ``outbox.*`` otherwise.
MESSAGING_SYSTEM = "messaging.system"
OPERATION_TYPE = "messaging.operation.type"
OPERATION_NAME = "messaging.operation.name"
DESTINATION = "messaging.destination.name"
DESTINATION_PARTITION = "messaging.destination.partition.id"
BATCH_COUNT = "messaging.batch.message_count"
KAFKA_OFFSET = "messaging.kafka.offset"
CONSUMER_GROUP = "messaging.consumer.group.name"
#: Set instead of :data:`DESTINATION` when one batch goes to several real topics.
DESTINATIONS = "outbox.destination.names"
TRANSACTION_ID = "outbox.transaction.id"
PRODUCER_GROUP = "outbox.producer.group"
MESSAGE_INDEX = "outbox.message.index"
HALF_PARTITION = "outbox.half.partition"
HALF_OFFSET = "outbox.half.offset"
OP_STATE = "outbox.op.state"
OP_WRITTEN = "outbox.op.written"
LOCAL_STATE = "outbox.local_transaction.state"

Attributes = dict[str, "AttributeValue"]
RawHeaders = Iterable[tuple[str, str | bytes | None]]


def txn_attributes(txn: OutboxTransaction) -> Attributes:
    """What every producer span carries: the transaction and its producer group."""
    return {
        TRANSACTION_ID: txn.txn_id,
        PRODUCER_GROUP: txn.producer.settings.producer_group,
    }


def send_span(txn: OutboxTransaction, messages: Sequence[HalfMessage]) -> tuple[str, Attributes]:
    """The span name and attributes of one half send: ``outbox.send`` for one message,
    ``outbox.send_batch`` for several."""
    attributes = txn_attributes(txn)
    attributes[MESSAGING_SYSTEM] = "kafka"
    attributes[OPERATION_TYPE] = "send"
    attributes[OPERATION_NAME] = "send"
    topics = sorted({m.topic for m in messages})
    if len(topics) == 1:
        attributes[DESTINATION] = topics[0]
    else:
        attributes[DESTINATIONS] = topics
    if len(messages) == 1:
        return SEND, attributes
    attributes[BATCH_COUNT] = len(messages)
    return SEND_BATCH, attributes


def op_attributes(op: OpRecord) -> Attributes:
    """The ``outbox.op`` span's attributes."""
    return {
        TRANSACTION_ID: op.txn_id,
        PRODUCER_GROUP: op.producer_group,
        OP_STATE: op.state.value,
        HALF_PARTITION: op.half_partition,
    }

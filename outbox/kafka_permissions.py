"""What to tell the user when Kafka refuses the producer's principal a topic: an ACL missing.

Kafka says only "Topic authorization failed"; which topic, and what to grant, is ours to say.
README ("Kafka permissions") lists what the producer's principal needs.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException


def not_allowed(error: KafkaError | BaseException | None) -> bool:
    """Whether ``error`` (librdkafka's, or the ``KafkaException`` carrying it) is Kafka
    refusing the principal a topic, not the broker failing."""
    if isinstance(error, KafkaException) and error.args:
        error = error.args[0]
    return isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def grant_hint(error: KafkaError | BaseException | None, topic: str) -> str:
    """``"; grant ... on topic"`` to append to a message about ``error``, when it says the
    producer's principal may not write ``topic``; else nothing."""
    if not not_allowed(error):
        return ""
    return f"; grant the producer's principal Write and Describe on {topic}"

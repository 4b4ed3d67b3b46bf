"""What to tell the user when Kafka refuses the producer's principal a topic: an ACL missing.

Kafka says only "Topic authorization failed"; which topic, and what to grant, is ours to say.
README ("Kafka permissions") lists what the producer's principal needs.
"""

from __future__ import annotations

from confluent_kafka import KafkaError

#: Kafka's answer that a principal may not write (or describe) a topic.
NOT_ALLOWED = frozenset({KafkaError.TOPIC_AUTHORIZATION_FAILED})


def not_allowed(error: KafkaError | None) -> bool:
    """Whether ``error`` is Kafka refusing the principal (not the broker failing)."""
    return error is not None and error.code() in NOT_ALLOWED


def grant_hint(error: KafkaError | None, topic: str) -> str:
    """``"; grant ... on topic"`` to append to a message about ``error``, when it says the
    producer's principal may not write ``topic``; else nothing."""
    if not not_allowed(error):
        return ""
    return f"; grant the producer's principal Write and Describe on {topic}"

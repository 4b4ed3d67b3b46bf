"""What to tell the user when Kafka refuses a principal a topic or a group: an ACL missing.

Kafka says only "Topic authorization failed" or "Group authorization failed"; which topic or
group, and what to grant, is ours to say. README ("Kafka permissions") lists what the
producer's principal needs, docs/relay.md and docs/checks.md the services'.
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


def member_hint(error: KafkaError, service: str, group_id: str, topics: tuple[str, ...]) -> str:
    """``"; grant ..."`` to append to a consumer error of a service's group member (the relay's
    or the checker's, ``service``) when Kafka refuses its principal the group or the topics it
    reads; else nothing. A member refused either joins nothing, so it reads nothing."""
    if error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
        return f"; grant the {service}'s principal Read on group {group_id}"
    if error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        granted = "Read, Write and Describe"  # what it needs on its internal topics, all three
        return f"; grant the {service}'s principal {granted} on {' and '.join(topics)}"
    return ""

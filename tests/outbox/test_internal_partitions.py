"""How a producer reads the internal topics' partition counts from a listing of every topic.

The listing is librdkafka's own metadata objects, filled the way the broker's answer fills them:
a topic absent (it does not exist, or ACLs hide it), present with partitions, or present with a
topic-level error. Only the first is a topic to create; telling a user to create a topic that
exists, because its leader is moving, sends them the wrong way. The real broker's missing-topic
case is ``tests/outbox/test_topics.py``'s."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    ClusterMetadata,
    PartitionMetadata,
    TopicMetadata,
)

from outbox import KafkaOperationError, TopicMismatchError
from outbox.kafka_io import internal_partitions
from outbox.protocol.topics import TopicNames

NAMES = TopicNames("orders")


def listing(**topics: int | KafkaError) -> ClusterMetadata:
    """Every topic the client may see: a partition count, or the error the broker gave it."""
    cluster = ClusterMetadata()
    for name, found in topics.items():
        topic = TopicMetadata()
        topic.topic = name
        if isinstance(found, KafkaError):
            topic.error = found
        else:
            for p in range(found):
                partition = PartitionMetadata()
                partition.id = p
                topic.partitions[p] = partition
        cluster.topics[name] = topic
    return cluster


def named(**topics: int | KafkaError) -> ClusterMetadata:
    return listing(**{getattr(NAMES, k): v for k, v in topics.items()})


def test_both_topics_listed_give_their_partition_count() -> None:
    assert internal_partitions(named(half=6, op=6), NAMES) == 6


@pytest.mark.parametrize("missing", ["half", "op"])
def test_a_topic_not_listed_is_one_to_create_or_one_hidden_by_acls(missing: str) -> None:
    present = {"half": 3, "op": 3}
    del present[missing]
    with pytest.raises(KafkaOperationError) as refused:
        internal_partitions(named(**present), NAMES)
    message = str(refused.value)
    assert f"internal topic {getattr(NAMES, missing)} does not exist" in message
    assert "kafka-outbox topics ensure" in message
    assert "Describe and Write" in message  # the ACL case: the topic exists, unseen


@pytest.mark.parametrize(
    "code",
    [KafkaError.LEADER_NOT_AVAILABLE, KafkaError.TOPIC_AUTHORIZATION_FAILED],
    ids=["LEADER_NOT_AVAILABLE", "TOPIC_AUTHORIZATION_FAILED"],
)
def test_a_topic_listed_with_an_error_is_named_with_it_not_called_missing(code: int) -> None:
    error = KafkaError(code)
    with pytest.raises(KafkaOperationError) as refused:
        internal_partitions(named(half=3, op=error), NAMES)
    message = str(refused.value)
    assert f"{error.name()} for internal topic {NAMES.op}" in message
    assert "does not exist" not in message
    assert "ensure" not in message
    assert refused.value.kafka_error is error


def test_a_topic_listed_with_no_partitions_does_not_exist() -> None:
    with pytest.raises(KafkaOperationError, match=f"internal topic {NAMES.half} does not exist"):
        internal_partitions(named(half=0, op=3), NAMES)


def test_unequal_counts_are_refused_naming_both() -> None:
    with pytest.raises(TopicMismatchError, match=f"{NAMES.half} has 6 partitions and"):
        internal_partitions(named(half=6, op=3), NAMES)

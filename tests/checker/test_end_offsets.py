"""The half partitions' end offsets, which a checker must have before it writes a COMMIT, come
from its consumer when the admin client cannot give them: on a three-broker cluster under kill
-9, librdkafka's admin client answered FENCED_LEADER_EPOCH for 15 minutes and a checker that
asked only it never applied its answers (docs/clusters.md). Here the admin client that cannot
answer is one whose broker is gone. Either way the end is the high watermark, past a Kafka
transaction still open (a relay's put-back copies): the checker's own read_committed consumer
would stop at it, before half records acknowledged after it. And an end is never made up: a
leader that does not answer in time gets an admin answer of offset -1001 without an error from
librdkafka, which every read position passes (a COMMIT naming part of a transaction, in the
three-broker fault test)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from checker.end_offsets import end_offsets
from outbox.kafka_logging import log_to_python
from outbox.testing import HarnessSettings
from outbox.testing.stopping import freeze, thaw
from outbox.watermarks import Watermarks
from tests.kafka_helpers import add_partitions, admin_client, create_topic, open_transaction, unique
from tests.outbox.test_broker_down import pausable_broker

pytestmark = pytest.mark.integration


@pytest.fixture
def topic(kafka_bootstrap: str) -> str:
    """Two partitions holding 3 and 0 records."""
    name = unique("halves")
    create_topic(kafka_bootstrap, name, partitions=2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for _ in range(3):
        producer.produce(name, b"x", partition=0)
    assert producer.flush(30) == 0
    return name


@pytest.fixture
def watermarks(kafka_bootstrap: str) -> Iterator[Watermarks]:
    client = Watermarks({"bootstrap.servers": kafka_bootstrap})
    yield client
    client.close()


@pytest.fixture
def gone() -> AdminClient:
    """An admin client whose every request fails (no broker answers at its address)."""
    return AdminClient(
        log_to_python(
            {"bootstrap.servers": "127.0.0.1:9", "socket.connection.setup.timeout.ms": 1000}
        )
    )


def test_end_offsets_come_from_the_admin_client(
    kafka_bootstrap: str, topic: str, watermarks: Watermarks
) -> None:
    admin = admin_client(kafka_bootstrap)
    assert end_offsets(admin, watermarks, topic, {0, 1}, timeout=10) == {0: 3, 1: 0}


def test_partitions_the_admin_client_cannot_answer_for_are_asked_of_a_consumer(
    topic: str, watermarks: Watermarks, gone: AdminClient
) -> None:
    # Given an admin client that cannot answer, When the ends are asked, Then a consumer gives them
    assert end_offsets(gone, watermarks, topic, {0, 1}, timeout=3) == {0: 3, 1: 0}


@pytest.mark.parametrize("admin_answers", [True, False])
def test_the_end_lies_past_a_transaction_still_open(
    kafka_bootstrap: str, topic: str, watermarks: Watermarks, gone: AdminClient, admin_answers: bool
) -> None:
    # Given a Kafka transaction open on partition 1 and a half record acknowledged after it
    opened = open_transaction(kafka_bootstrap, topic, partition=1)
    try:
        producer = Producer({"bootstrap.servers": kafka_bootstrap})
        producer.produce(topic, b"x", partition=1)
        assert producer.flush(30) == 0
        admin = admin_client(kafka_bootstrap) if admin_answers else gone
        # Then the end is past both, not the open transaction's first offset
        assert end_offsets(admin, watermarks, topic, {0, 1}, timeout=3) == {0: 3, 1: 2}
    finally:
        opened.abort_transaction(30)


def test_a_partition_the_consumer_knows_nothing_of_is_answered_by_the_next_round(
    kafka_bootstrap: str, topic: str, gone: AdminClient
) -> None:
    # Given an admin client that cannot answer (in CI's three-broker test it failed alongside),
    # a consumer that has learnt the topic's two partitions, and the topic grown to three
    # afterwards: the consumer's metadata names no leader for the third, and librdkafka fails
    # its query without asking a broker (there, a partition's entry went wrong under broker
    # restarts, and a checker applied no answer for 4 minutes)
    watermarks = Watermarks({"bootstrap.servers": kafka_bootstrap}, renew_after_s=0)
    try:
        assert end_offsets(gone, watermarks, topic, {0, 1}, timeout=3) == {0: 3, 1: 0}
        add_partitions(kafka_bootstrap, topic, 3)
        # When the checker asks round after round
        rounds = [end_offsets(gone, watermarks, topic, {0, 1, 2}, timeout=3) for _ in range(2)]
        # Then its first round lacks the third end, and its second, from a fresh client, has it
        assert rounds == [{0: 3, 1: 0}, {0: 3, 1: 0, 2: 0}]
        assert watermarks.renewals == 1
    finally:
        watermarks.close()


@pytest.mark.processes  # a broker of its own, frozen
def test_a_leader_that_does_not_answer_in_time_gives_no_end(
    harness_settings: HarnessSettings, tmp_path: Path
) -> None:
    # Given a broker of the test's own leading a half partition of 3 records, both clients
    # having asked it (the checker's admin client, and its consumer asking watermarks)
    with pausable_broker(harness_settings, tmp_path) as broker:
        create_topic(broker.bootstrap, "halves", partitions=1)
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        for _ in range(3):
            producer.produce("halves", b"x", partition=0)
        assert producer.flush(30) == 0
        admin = admin_client(broker.bootstrap)
        watermarks = Watermarks({"bootstrap.servers": broker.bootstrap}, renew_after_s=3600)
        try:
            assert end_offsets(admin, watermarks, "halves", {0}, timeout=3) == {0: 3}
            assert watermarks.query("halves", 0, timeout=3)[1] == 3
            # When the leader stops answering (frozen: its connections open, as a broker killed
            # on another host is until its connections time out)
            assert broker.proc is not None
            freeze(broker.proc.pid)
            try:
                # (librdkafka 2.16's admin answer then: offset -1001, no error - what was taken
                # for the end, read to before anything was read; an error would do no harm)
                [answer] = admin.list_offsets(
                    {TopicPartition("halves", 0): OffsetSpec.latest()},  # type: ignore[no-untyped-call]
                    request_timeout=3,
                ).values()
                with contextlib.suppress(KafkaException):
                    assert answer.result().offset < 0
                ends = end_offsets(admin, watermarks, "halves", {0}, timeout=3)
            finally:
                thaw(broker.proc.pid)
            # Then its partition has no end (it was {0: -1001}), and the checker applies its
            # COMMIT answers in a later round
            assert ends == {}
        finally:
            watermarks.close()

"""``resume`` end to end: a transaction the checker gave up is put back by the operator, checked
again from a count of zero, committed by its producer's answer and promoted exactly once."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from checker import Checker, CheckerSettings
from outbox import (
    LocalTransactionState,
    Message,
    OutboxProducer,
    OutboxSettings,
    TransactionalProducer,
)
from outbox.protocol import DecidedBy, OpState
from relay import Relay, RelaySettings
from tests.checker.test_checker import Background, wait_for
from tests.kafka_helpers import create_topic, unique
from tests.outbox_cli.conftest import Cli
from tests.producer_fixtures import Topics
from tests.relay.test_relay import read_topic

pytestmark = pytest.mark.integration
SECRET = "resume-end-to-end"


class Answering:
    """A listener whose local transaction is UNKNOWN and whose check answers ``answer``."""

    def __init__(self, answer: LocalTransactionState) -> None:
        self.answer = answer

    def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
        return LocalTransactionState.UNKNOWN

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        return self.answer


@pytest.fixture
def services(kafka_bootstrap: str, outbox_settings: OutboxSettings) -> Iterator[Checker]:
    checker = Checker(
        CheckerSettings(
            bootstrap_servers=kafka_bootstrap,
            secret=SECRET,
            topic_prefix=outbox_settings.topic_prefix,
            group_id=unique("checker"),
            transaction_timeout_s=1,
            check_interval_s=1,
            check_max=2,
        )
    )
    relay = Relay(
        RelaySettings(
            bootstrap_servers=kafka_bootstrap,
            topic_prefix=outbox_settings.topic_prefix,
            group_id=unique("relay"),
        )
    )
    running = [Background(checker), Background(relay)]
    yield checker
    for service in running:
        service.stop()


def test_a_resumed_transaction_is_checked_again_and_delivered_once_its_producer_says_commit(
    cli: Cli,
    operator_env: dict[str, str],
    kafka_bootstrap: str,
    outbox_settings: OutboxSettings,
    topics: Topics,
    services: Checker,
) -> None:
    topic = unique("resumed")
    create_topic(kafka_bootstrap, topic, partitions=1)
    listener = Answering(LocalTransactionState.UNKNOWN)
    producer = OutboxProducer(outbox_settings)
    sender = TransactionalProducer(producer, listener)
    producer.serve_checks(secret=SECRET)
    try:
        # Given a transaction whose producer answered UNKNOWN until the checker gave it up
        sent = sender.send_message_in_transaction(
            Message(topic, b"late but committed", key=b"order-7")
        )
        txn = sent.transaction_id

        def states() -> list[OpState]:
            return [o.state for o in topics.ops() if o.txn_id == txn]

        wait_for(lambda: states() == [OpState.GIVEN_UP], timeout=60)
        wait_for(lambda: services.stats.given_up == 1, timeout=10)  # once its op was taken
        # When the operator resumes it and the producer now knows it committed
        listener.answer = LocalTransactionState.COMMIT
        done = cli("resume", txn, env=operator_env)
        assert done.code == 0, done.err
        # Then the checker checks it again and decides COMMIT; the relay promotes it, once
        wait_for(lambda: states()[-1:] == [OpState.COMMIT], timeout=60)
        wait_for(lambda: len(read_topic(kafka_bootstrap, topic)) >= 1, timeout=60)
        time.sleep(2)  # a second delivery would show up now
        [record] = read_topic(kafka_bootstrap, topic)
        assert record.value() == b"late but committed" and record.key() == b"order-7"
        assert states() == [OpState.GIVEN_UP, OpState.RESUMED, OpState.COMMIT]
        last = [o for o in topics.ops() if o.txn_id == txn][-1]
        assert last.decided_by is DecidedBy.CHECKER and last.half_offsets == sent.half.offsets
        # and it was not given up a second time, nor counted as a conflict
        assert services.stats.given_up == 1 and services.tracker.conflicts == 0
    finally:
        producer.close()

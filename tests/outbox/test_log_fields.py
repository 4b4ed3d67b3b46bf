"""JSON logs carry the transaction id, group, topic, partition and offsets of what they are about
as top-level fields (``outbox.logs.fields``), read here from the JSON lines of real paths: the
producer losing an op, the relay dead-lettering an op and parking a transaction, the checker
giving one up."""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy.orm import sessionmaker

from outbox import Message, OutboxProducer, OutboxSettings, TransactionalProducer
from outbox.logs import JsonFormatter
from outbox.protocol import DecidedBy, OpRecord, OpState, encode_op, new_transaction_id
from relay import RelaySettings
from tests.checker.test_checker import SECRET, Forever
from tests.kafka_helpers import set_topic_config, unique
from tests.pipeline import pipeline
from tests.producer_fixtures import Topics
from tests.relay.test_relay import RelayThread, Stream

pytestmark = pytest.mark.integration


class JsonLines:
    """What a ``log_format=json`` service writes (a stream handler with the JSON formatter)."""

    def __init__(self, stream: io.StringIO) -> None:
        self.stream = stream

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stream.getvalue().splitlines()]

    def wait_for(self, match: Callable[[dict[str, Any]], bool], timeout: float = 60) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            found = [line for line in self.lines() if match(line)]
            if found:
                return found[0]
            assert time.monotonic() < deadline, [line["msg"] for line in self.lines()]
            time.sleep(0.2)


@contextmanager
def json_logs(logger: str) -> Iterator[JsonLines]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.setLevel(logging.WARNING)
    target = logging.getLogger(logger)
    target.addHandler(handler)
    try:
        yield JsonLines(stream)
    finally:
        target.removeHandler(handler)


def test_an_op_the_producer_could_not_write_is_logged_with_its_transaction_partition_offsets(
    kafka_bootstrap: str, outbox_settings: OutboxSettings, session_factory: sessionmaker
) -> None:
    # Given an op topic that refuses every op (too large for it)
    set_topic_config(kafka_bootstrap, outbox_settings.topics.op, "max.message.bytes", "16")
    with (
        json_logs("outbox") as logs,
        OutboxProducer(outbox_settings) as producer,
        producer.transaction(session_factory) as txn,
    ):
        txn.send("orders", b"x", key="k")
        txn.send("orders", b"y", key="k")
    # Then the warning names the transaction and where its half records are, as fields
    line = logs.wait_for(lambda line: "not written" in line["msg"])
    assert txn.coordinates is not None
    assert line["txn_id"] == txn.txn_id
    assert line["partition"] == txn.coordinates.partition
    assert line["offsets"] == list(txn.coordinates.offsets)
    assert line["level"] == "WARNING" and txn.txn_id in line["msg"]


def test_the_relay_logs_a_dead_lettered_op_and_a_parked_transaction_with_their_fields(
    kafka_bootstrap: str,
) -> None:
    stream = Stream(kafka_bootstrap, unique("__outbox-relay"))
    topics = stream.settings.topics
    # Given a COMMIT op naming half records past the end of its partition
    bad = OpRecord(new_transaction_id(), OpState.COMMIT, "g", 0, (10_000,), DecidedBy.PRODUCER, 0)
    key, value = encode_op(bad)
    where: list[tuple[int, int]] = []
    stream.producer.produce(
        topics.op,
        key=key,
        value=value,
        partition=0,
        on_delivery=lambda err, msg: where.append((msg.partition(), msg.offset())),
    )
    stream.producer.flush(30)
    # and a committed transaction whose real topic does not exist (auto_create_topics is off)
    stream.real_topic = unique("missing")
    [parked] = stream.write_halves([(b"p", 2, OpState.COMMIT)])
    stream.write_ops([parked])
    settings = RelaySettings(
        bootstrap_servers=kafka_bootstrap,
        topic_prefix=stream.settings.topic_prefix,
        group_id=unique("relay"),
    )
    with json_logs("relay") as logs:
        running = RelayThread(settings)
        try:
            lettered = logs.wait_for(lambda line: line["msg"].startswith("dead-lettering"))
            parking = logs.wait_for(lambda line: "parked" in line["msg"])
        finally:
            running.stop()
    # Then the dead letter's line names the op record it is about
    assert {k: lettered[k] for k in ("txn_id", "group", "topic", "partition", "offset")} == {
        "txn_id": bad.txn_id,
        "group": "g",
        "topic": topics.op,
        "partition": where[0][0],
        "offset": where[0][1],
    }
    # and the parked transaction's line names it and where its half records are
    assert {k: parking[k] for k in ("txn_id", "group", "partition", "offsets")} == {
        "txn_id": parked.txn_id,
        "group": "g",
        "partition": parked.partition,
        "offsets": list(parked.offsets),
    }


def test_the_checker_logs_a_transaction_it_gives_up_with_its_fields(
    kafka_bootstrap: str, producer: OutboxProducer, topics: Topics
) -> None:
    # Given a listener transaction whose check answers UNKNOWN for ever (its op is never written)
    sender = TransactionalProducer(producer, Forever())
    producer.serve_checks(resolver=None, secret=SECRET)
    with json_logs("checker") as logs, pipeline(kafka_bootstrap, topics, check_max=1) as running:
        result = sender.send_message_in_transaction(
            Message(running.topic, b"undecided", key="k"), arg=None
        )
        # When the checker gives it up
        assert running.decided([result.transaction_id]) == {result.transaction_id: "GIVEN_UP"}
        line = logs.wait_for(lambda line: line["msg"].startswith("giving up"))
    # Then its line names the transaction, its group and where its half records are
    assert {k: line[k] for k in ("txn_id", "group", "partition", "offsets")} == {
        "txn_id": result.transaction_id,
        "group": "orders",
        "partition": result.half.partition,
        "offsets": list(result.half.offsets),
    }

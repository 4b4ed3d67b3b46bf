"""``kafka-outbox status`` and ``inspect``, read from the topics of a real broker."""

from __future__ import annotations

import json
import time

import pytest

from outbox import OutboxSettings
from outbox.protocol import DecidedBy, OpState, new_transaction_id
from outbox.protocol.registry import Registration, encode_registration
from outbox.topics import ensure_topics
from tests.acl_kafka import AclKafka
from tests.kafka_helpers import create_topic, unique
from tests.outbox_cli.conftest import Cli
from tests.outbox_cli.records import Writer

pytestmark = pytest.mark.integration


def heartbeat(writer: Writer, group: str, instance: str, *, tombstone: bool = False) -> None:
    key, value = encode_registration(Registration(group, instance, f"http://{instance}:8081", "1"))
    writer.producer.produce(writer.names.registry, key=key, value=None if tombstone else value)
    assert writer.producer.flush(30) == 0


def test_status_counts_pending_once_per_message_given_up_and_live_instances(
    cli: Cli, operator_env: dict[str, str], outbox_settings: OutboxSettings
) -> None:
    # Given: one pending transaction of 2 messages with put-back copies, one committed, one
    # rolled back, one given up; two live instances of "orders", one shut down cleanly
    writer = Writer(outbox_settings)
    pending = writer.halves("orders", [b"a", b"b"], key=b"k-pending")
    writer.put_back(pending)
    committed = writer.halves("orders", [b"c"], key=b"k-pending")
    writer.op(committed, OpState.COMMIT)
    rolled_back = writer.halves("orders", [b"d"], key=b"k-pending")
    writer.op(rolled_back, OpState.ROLLBACK)
    given_up = writer.halves("orders", [b"e"], key=b"k-given-up")
    writer.give_up(given_up)
    for instance in ("orders-1", "orders-2", "orders-3"):
        heartbeat(writer, "orders", instance)
    heartbeat(writer, "orders", "orders-3", tombstone=True)

    # When status is asked for, as JSON
    result = cli("status", "--json", env=operator_env)

    # Then it exits 1 (a given-up transaction needs an operator) and counts each thing once
    assert result.code == 1, result.err
    document = json.loads(result.out)
    rows = {(r["group"], r["partition"]): r for r in document["partitions"]}
    row = rows[("orders", pending.partition)]
    given_up_row = rows[("orders", given_up.partition)]
    assert (row["pending_transactions"], row["pending_messages"]) == (1, 2)
    assert 0 <= row["oldest_pending_age_s"] < 120
    assert given_up_row["given_up"] == 1
    assert sum(r["pending_transactions"] for r in document["partitions"]) == 1
    assert document["given_up"] == 1
    assert sorted(i["instance_id"] for i in document["producers"]["orders"]) == [
        "orders-1",
        "orders-2",
    ]

    # And the table says the same to a person
    table = cli("status", env=operator_env)
    assert table.code == 1
    assert "GROUP" in table.out and "OLDEST PENDING" in table.out and "LIVE INSTANCES" in table.out
    assert "1 given-up transactions" in table.out

    # And once resumed, the transaction counts as pending again, and status exits 0
    assert cli("resume", given_up.txn_id, env=operator_env).code == 0
    after = cli("status", "--json", env=operator_env)
    assert after.code == 0, after.out
    rows = {(r["group"], r["partition"]): r for r in json.loads(after.out)["partitions"]}
    assert rows[("orders", given_up.partition)]["given_up"] == 0
    assert sum(r["pending_transactions"] for r in rows.values()) == 2


def test_status_since_scans_only_the_recent_records(
    cli: Cli, operator_env: dict[str, str], outbox_settings: OutboxSettings
) -> None:
    writer = Writer(outbox_settings)
    writer.halves("orders", [b"old"])
    time.sleep(2.5)
    writer.halves("orders", [b"new"])
    everything = json.loads(cli("status", "--json", env=operator_env).out)
    recent = json.loads(cli("status", "--json", "--since", "1.5s", env=operator_env).out)
    assert sum(r["pending_messages"] for r in everything["partitions"]) == 2
    assert sum(r["pending_messages"] for r in recent["partitions"]) == 1


def test_status_with_an_unreachable_broker_exits_3(cli: Cli, unused_port: int) -> None:
    env = {"OUTBOX_BOOTSTRAP_SERVERS": f"127.0.0.1:{unused_port}"}
    result = cli("status", "--timeout", "2s", env=env)
    assert result.code == 3
    assert result.err.count("\n") == 1 and "cannot reach Kafka" in result.err


def test_status_without_the_internal_topics_says_to_create_them(
    cli: Cli, kafka_bootstrap: str
) -> None:
    env = {"OUTBOX_BOOTSTRAP_SERVERS": kafka_bootstrap, "OUTBOX_TOPIC_PREFIX": unique("__none")}
    result = cli("status", env=env)
    assert result.code == 1
    assert "do not exist; create them with `kafka-outbox topics ensure`" in result.err


def test_status_under_credentials_that_may_not_describe_the_topics_says_so_too(
    cli: Cli, acl_broker: AclKafka
) -> None:
    """Kafka leaves a topic these credentials may not describe out of its topic list: the
    topics exist, and "create them" alone would send the operator the wrong way."""
    prefix = unique("__outbox-acl-status")
    ensure_topics(
        OutboxSettings(bootstrap_servers=acl_broker.plain, producer_group="g", topic_prefix=prefix)
    )
    env = {"OUTBOX_BOOTSTRAP_SERVERS": acl_broker.sasl, "OUTBOX_TOPIC_PREFIX": prefix}
    for key, value in acl_broker.librdkafka_login("auditor").items():
        env["OUTBOX_KAFKA__" + key.replace(".", "_").upper()] = value
    result = cli("status", env=env)
    assert result.code == 1
    assert f"topics {prefix}-half" in result.err
    assert (
        "may not describe is left out of Kafka's topic list too: grant them Describe" in result.err
    )


def test_inspect_tells_a_committed_transaction_s_whole_story(
    cli: Cli, operator_env: dict[str, str], outbox_settings: OutboxSettings, kafka_bootstrap: str
) -> None:
    # Given a transaction of two messages, put back once, committed, promoted
    topic = unique("orders-inspect")
    create_topic(kafka_bootstrap, topic, partitions=2)
    writer = Writer(outbox_settings)
    txn = writer.halves(topic, [b"one", b"two"])
    copies = writer.put_back(txn)
    writer.op(txn, OpState.COMMIT)
    promoted = writer.promote(txn, topic)
    writer.halves(topic, [b"someone else's"])  # not part of the story

    result = cli("inspect", txn.txn_id, "--json", env=operator_env)

    assert result.code == 0, result.err
    story = json.loads(result.out)
    assert story["state"] == "COMMIT"
    assert [(h["offset"], h["index"], h["copy_of"]) for h in story["halves"]] == [
        (txn.offsets[0], 0, None),
        (txn.offsets[1], 1, None),
        (copies[0], 0, txn.offsets[0]),
        (copies[1], 1, txn.offsets[1]),
    ]
    assert [(o["state"], o["decided_by"], o["half_offsets"]) for o in story["ops"]] == [
        ("COMMIT", "producer", txn.offsets)
    ]
    assert sorted((p["topic"], p["offset"], p["index"]) for p in story["promoted"]) == sorted(
        (topic, offset, index) for index, offset in enumerate(promoted)
    )
    assert story["dead_letters"] == []
    text = cli("inspect", txn.txn_id, env=operator_env)
    assert text.code == 0
    assert f"transaction {txn.txn_id}" in text.out
    assert "promoted records:" in text.out and topic in text.out


def test_inspect_shows_a_given_up_transaction_s_dead_letters_and_resume_marker(
    cli: Cli, operator_env: dict[str, str], outbox_settings: OutboxSettings
) -> None:
    writer = Writer(outbox_settings)
    txn = writer.halves("orders", [b"stuck"])
    writer.give_up(txn, reason="still UNKNOWN after 15 checks")
    assert cli("resume", txn.txn_id, env=operator_env).code == 0
    story = json.loads(cli("inspect", txn.txn_id, "--json", env=operator_env).out)
    assert story["state"] == "RESUMED"
    assert [o["state"] for o in story["ops"]] == ["GIVEN_UP", "RESUMED"]
    assert story["ops"][0]["decided_by"] == DecidedBy.CHECKER.value
    [letter] = story["dead_letters"]
    assert (letter["reason"], letter["source_offset"]) == (
        "still UNKNOWN after 15 checks",
        txn.offsets[0],
    )
    assert len(story["resume_markers"]) == 1


def test_inspect_of_an_unknown_transaction_exits_4_and_of_a_bad_id_exits_2(
    cli: Cli, operator_env: dict[str, str], unused_port: int
) -> None:
    unknown = new_transaction_id()
    result = cli("inspect", unknown, env=operator_env)
    assert result.code == 4
    assert result.err.startswith(f"kafka-outbox: error: unknown transaction {unknown}")
    assert cli("inspect", "42", env=operator_env).code == 2
    unreachable = {"OUTBOX_BOOTSTRAP_SERVERS": f"127.0.0.1:{unused_port}"}
    assert cli("inspect", unknown, "--timeout", "2s", env=unreachable).code == 3

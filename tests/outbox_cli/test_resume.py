"""``kafka-outbox resume``: a given-up transaction goes back to be checked, exactly once."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any, NamedTuple

import pytest
from confluent_kafka import Producer

from outbox import OutboxSettings
from outbox.protocol import (
    HALF_SCHEMA_VERSIONS,
    DecidedBy,
    Header,
    OpState,
    decode_half,
    decode_op,
    new_transaction_id,
)
from outbox.protocol.dead_letter import DeadLetterHeader, dead_letter_headers
from outbox_cli import resume as resume_cmd
from outbox_cli.errors import CommandError, RefusedError
from outbox_cli.kafka import Reader, connection
from tests.kafka_helpers import reported_without_offset
from tests.outbox_cli.conftest import Cli
from tests.outbox_cli.records import Writer, read_messages

pytestmark = pytest.mark.integration


def headers(msg) -> dict[str, bytes]:
    return dict(msg.headers() or [])


@pytest.mark.parametrize("version", HALF_SCHEMA_VERSIONS)
def test_resume_puts_copies_a_resumed_op_and_a_marker_in_one_go_and_refuses_a_second_time(
    cli: Cli, operator_env: dict[str, str], outbox_settings: OutboxSettings, version: int
) -> None:
    # Given a transaction the checker gave up: two halves (checked twice, of schema `version`),
    # their dead letters, a GIVEN_UP op
    names = outbox_settings.topics
    writer = Writer(outbox_settings)
    txn = writer.halves(
        "orders-resume", [b"first", b"second"], check_count=2, schema_version=version
    )
    writer.give_up(txn)
    half_end = len(read_messages(outbox_settings.bootstrap_servers, names.half, txn.partition))

    # When it is resumed
    done = cli("resume", txn.txn_id, env={**operator_env, "USER": "alice"})

    # Then the command says what it did
    assert done.code == 0, done.err
    assert f"resumed transaction {txn.txn_id}: 2 message(s)" in done.out
    # And the half partition has one copy of each message: value, original headers less the
    # dead-letter ones, in the original's schema version, check count 0, origin offset = the
    # original's
    halves = [
        m
        for m in read_messages(outbox_settings.bootstrap_servers, names.half, txn.partition)
        if m.key() == txn.txn_id.encode()
    ]
    originals, copies = halves[:2], halves[2:]
    assert [m.value() for m in copies] == [b"first", b"second"]
    assert all(m.offset() >= half_end for m in copies)
    for original, copy in zip(originals, copies, strict=True):
        got = headers(copy)
        assert set(got) == {*headers(original), Header.ORIGIN_OFFSET.value}
        assert got[Header.ORIGIN_OFFSET.value] == str(original.offset()).encode()
        record = decode_half(value=copy.value(), headers=copy.headers(), offset=copy.offset())
        was = decode_half(value=original.value(), headers=original.headers())
        assert (record.is_copy, record.original_offset) == (True, original.offset())
        assert (record.check_count, was.check_count) == (0, 2)
        assert record.schema_version == was.schema_version == version
        assert replace(record, check_count=2, origin_offset=None) == replace(
            was, offset=copy.offset(), raw_headers=record.raw_headers
        )
    # And the latest op is RESUMED (decided by the checker, naming the copies), not terminal
    ops = [
        decode_op(m.key(), m.value())
        for m in read_messages(outbox_settings.bootstrap_servers, names.op, txn.partition)
        if m.key() == txn.txn_id.encode()
    ]
    assert [o.state for o in ops] == [OpState.GIVEN_UP, OpState.RESUMED]
    resumed = ops[-1]
    assert resumed.half_offsets == tuple(m.offset() for m in copies)
    assert resumed.half_partition == txn.partition
    assert resumed.reason is not None and resumed.reason.startswith("resumed by alice@")
    # And the dead letters are followed by a marker, and nothing else was added
    letters = [
        m
        for m in read_messages(outbox_settings.bootstrap_servers, names.dead_letter, txn.partition)
        if m.key() == txn.txn_id.encode()
    ]
    assert len(letters) == 3
    marker = letters[-1]
    assert marker.value() is None
    assert DeadLetterHeader.RESUMED_AT.value in headers(marker)
    assert DeadLetterHeader.REASON.value not in headers(marker)

    # When it is resumed again, it is refused, naming the state, and nothing is written
    again = cli("resume", txn.txn_id, env=operator_env)
    assert again.code == 5
    assert f"transaction {txn.txn_id} is RESUMED, not GIVEN_UP" in again.err
    assert again.err.count("\n") == 1  # one line, no traceback
    after = read_messages(outbox_settings.bootstrap_servers, names.half, txn.partition)
    assert len([m for m in after if m.key() == txn.txn_id.encode()]) == 4


def test_a_transaction_given_up_again_after_a_resume_can_be_resumed_again(
    cli: Cli, operator_env: dict[str, str], outbox_settings: OutboxSettings
) -> None:
    writer = Writer(outbox_settings)
    txn = writer.halves("orders-resume", [b"only"])
    writer.give_up(txn)
    assert cli("resume", txn.txn_id, env=operator_env).code == 0
    # The checker gives it up once more: new dead letters after the marker, a new GIVEN_UP op
    writer.give_up(txn, reason="no producer of group 'orders' answered")
    second = cli("resume", txn.txn_id, env=operator_env)
    assert second.code == 0, second.err
    copies = [
        m
        for m in read_messages(
            outbox_settings.bootstrap_servers, outbox_settings.topics.half, txn.partition
        )
        if m.key() == txn.txn_id.encode()
    ]
    assert len(copies) == 3  # the original, one copy per resume


def test_resume_refuses_a_committed_transaction_naming_its_state(
    cli: Cli, operator_env: dict[str, str], outbox_settings: OutboxSettings
) -> None:
    writer = Writer(outbox_settings)
    txn = writer.halves("orders-resume", [b"x"])
    writer.op(txn, OpState.COMMIT)
    refused = cli("resume", txn.txn_id, env=operator_env)
    assert refused.code == 5
    assert "is COMMIT, not GIVEN_UP" in refused.err


def test_resume_refuses_a_dead_letter_it_cannot_read_as_a_half_record_and_writes_nothing(
    cli: Cli, operator_env: dict[str, str], outbox_settings: OutboxSettings
) -> None:
    # Given a given-up transaction whose dead letter holds a half record of a newer schema
    names = outbox_settings.topics
    writer = Writer(outbox_settings)
    txn = writer.halves("orders-resume", [b"x"])
    [half] = [
        m
        for m in read_messages(outbox_settings.bootstrap_servers, names.half, txn.partition)
        if m.key() == txn.txn_id.encode()
    ]
    future = [(n, b"3" + v[1:] if n == "outbox-half" else v) for n, v in half.headers()]
    writer.producer.produce(
        names.dead_letter,
        key=txn.txn_id.encode(),
        value=half.value(),
        headers=dead_letter_headers(
            future,
            reason="still UNKNOWN after 15 checks",
            source_topic=names.half,
            source_partition=txn.partition,
            source_offset=half.offset(),
        ),
        partition=txn.partition,
    )
    refused = _given_up_then_resumed(cli, operator_env, outbox_settings, writer, txn)

    assert refused.code == 5
    assert "does not hold a readable half record" in refused.err
    assert len(read_messages(outbox_settings.bootstrap_servers, names.half)) == refused.halves
    ops = [
        decode_op(m.key(), m.value())
        for m in read_messages(outbox_settings.bootstrap_servers, names.op, txn.partition)
        if m.key() == txn.txn_id.encode()
    ]
    assert [o.state for o in ops if o is not None] == [OpState.GIVEN_UP]


@pytest.mark.parametrize("original_headers", [True, False], ids=["refused once", "twice"])
def test_resume_refuses_a_dead_letter_whose_value_its_topic_refused_and_writes_nothing(
    cli: Cli, operator_env: dict[str, str], outbox_settings: OutboxSettings, original_headers: bool
) -> None:
    """Before, the copy was put back with no value, and the relay delivered a null (on a
    compacted topic, deleting the key) in place of the message."""
    # Given a given-up transaction whose dead letter the topic first refused (too large), so
    # the checker wrote it again without the value, saying so (checker/writer.py)
    names = outbox_settings.topics
    writer = Writer(outbox_settings)
    txn = writer.halves("orders-resume", [b"x" * 100])
    [half] = [
        m
        for m in read_messages(outbox_settings.bootstrap_servers, names.half, txn.partition)
        if m.key() == txn.txn_id.encode()
    ]
    headers = dead_letter_headers(
        half.headers() if original_headers else (),  # refused twice: without them too
        reason="still UNKNOWN after 15 checks",
        source_topic=names.half,
        source_partition=txn.partition,
        source_offset=half.offset(),
    )
    headers.append((DeadLetterHeader.OMITTED.value, b"the dead-letter topic refused it"))
    writer.producer.produce(
        names.dead_letter,
        key=txn.txn_id.encode(),
        value=None,
        headers=headers,
        partition=txn.partition,
    )
    refused = _given_up_then_resumed(cli, operator_env, outbox_settings, writer, txn)

    assert refused.code == 5
    assert "holds no value (the dead-letter topic refused it)" in refused.err
    assert f"{names.half}[{txn.partition}]@{half.offset()} back by hand" in refused.err
    assert len(read_messages(outbox_settings.bootstrap_servers, names.half)) == refused.halves


def test_resume_of_an_unknown_transaction_exits_4(
    cli: Cli, operator_env: dict[str, str], outbox_settings: OutboxSettings
) -> None:
    unknown = new_transaction_id()
    result = cli("resume", unknown, env=operator_env)
    assert result.code == 4
    assert result.err.startswith(f"kafka-outbox: error: unknown transaction {unknown}")


def test_resume_with_an_unreachable_broker_exits_3_in_one_line(cli: Cli, unused_port: int) -> None:
    result = cli(
        "--timeout",
        "2s",
        "resume",
        new_transaction_id(),
        env={"OUTBOX_BOOTSTRAP_SERVERS": f"127.0.0.1:{unused_port}"},
    )
    assert result.code == 3
    assert result.err.startswith(
        f"kafka-outbox: error: cannot reach Kafka at 127.0.0.1:{unused_port}"
    )
    assert result.err.count("\n") == 1


def test_resume_of_something_that_is_not_a_transaction_id_is_a_usage_error(cli: Cli) -> None:
    result = cli("resume", "order-42", env={"OUTBOX_BOOTSTRAP_SERVERS": "unused:9092"})
    assert result.code == 2
    assert "'order-42' is not a UUID" in result.err


@pytest.mark.parametrize("moment", ["before-copies", "before-commit"])
def test_two_concurrent_resumes_of_one_transaction_put_it_back_once(
    outbox_settings: OutboxSettings, monkeypatch: pytest.MonkeyPatch, moment: str
) -> None:
    """The second resume initialises the same transactional id while the first one's Kafka
    transaction is open: the first is fenced and aborted, and its copies never become visible.
    Without the fencing both would commit and the transaction would be put back twice."""
    names = outbox_settings.topics
    bootstrap = outbox_settings.bootstrap_servers
    writer = Writer(outbox_settings)
    txn = writer.halves("orders-resume", [b"first", b"second"])
    writer.give_up(txn)
    config = connection(bootstrap, {})
    # The first resume stops inside its Kafka transaction: before its first copy is produced,
    # or before its commit (copies, op and marker written)
    calls: dict[str, int] = {}
    paused, go_on = threading.Event(), threading.Event()

    def pause(at: str) -> None:
        if threading.current_thread().name == "first" and at == moment and not paused.is_set():
            paused.set()
            go_on.wait(60)

    unpaused = resume_cmd._call

    def call(fn: Any) -> Any:
        name = threading.current_thread().name
        calls[name] = calls.get(name, 0) + 1
        if calls[name] == 3:  # init, begin, then commit
            pause("before-commit")
        return unpaused(fn)

    class PausingProducer(Producer):
        def produce(self, *args: Any, **kwargs: Any) -> None:
            pause("before-copies")
            super().produce(*args, **kwargs)

    monkeypatch.setattr(resume_cmd, "_call", call)
    monkeypatch.setattr(resume_cmd, "Producer", PausingProducer)
    outcome: dict[str, Any] = {}

    def first() -> None:
        with Reader(config, 30) as reader:
            try:
                outcome["first"] = resume_cmd.resume(
                    config, reader, names, 3, txn.txn_id, slack_s=5, timeout=30
                )
            except Exception as err:
                outcome["first"] = err

    thread = threading.Thread(target=first, name="first")
    thread.start()
    try:
        assert paused.wait(60)
        # When a second resume runs meanwhile, it goes through
        with Reader(config, 30) as reader:
            second = resume_cmd.resume(config, reader, names, 3, txn.txn_id, slack_s=5, timeout=30)
    finally:
        go_on.set()
        thread.join(60)
    # Then the first is refused at its commit, saying why (before: an unexpected
    # KafkaException from the flush after it)
    assert isinstance(outcome["first"], RefusedError), outcome
    assert "another resume of this transaction" in str(outcome["first"])
    assert "fenced" in str(outcome["first"])
    # And the transaction was put back once: one copy of each message, one RESUMED op (naming
    # the second's copies) and one marker, as a read_committed reader sees them
    copies = [
        m
        for m in read_messages(bootstrap, names.half, txn.partition)
        if m.key() == txn.txn_id.encode() and Header.ORIGIN_OFFSET.value in headers(m)
    ]
    assert [m.value() for m in copies] == [b"first", b"second"]
    assert tuple(m.offset() for m in copies) == second.copies
    ops = [
        decode_op(m.key(), m.value())
        for m in read_messages(bootstrap, names.op, txn.partition)
        if m.key() == txn.txn_id.encode()
    ]
    assert [o.state for o in ops] == [OpState.GIVEN_UP, OpState.RESUMED]
    markers = [
        m
        for m in read_messages(bootstrap, names.dead_letter, txn.partition)
        if m.key() == txn.txn_id.encode() and m.value() is None
    ]
    assert len(markers) == 1


def test_a_copy_acknowledged_without_an_offset_aborts_the_resume_and_writes_nothing(
    outbox_settings: OutboxSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the RESUMED op named offset 0 for such a copy: the checker would have fetched
    whatever record is there, and the real copy would never have been named."""
    names = outbox_settings.topics
    bootstrap = outbox_settings.bootstrap_servers
    writer = Writer(outbox_settings)
    txn = writer.halves("orders-resume", [b"first", b"second"])
    writer.give_up(txn)
    config = connection(bootstrap, {})

    class DuplicateReportingProducer(Producer):
        def produce(self, *args: Any, **kwargs: Any) -> None:
            report = kwargs.get("on_delivery")
            if report is not None and args and args[0] == names.half:
                kwargs["on_delivery"] = reported_without_offset(report)
            super().produce(*args, **kwargs)

    monkeypatch.setattr(resume_cmd, "Producer", DuplicateReportingProducer)
    with Reader(config, 30) as reader, pytest.raises(CommandError, match="with its offset"):
        resume_cmd.resume(config, reader, names, 3, txn.txn_id, slack_s=5, timeout=30)

    # Nothing became visible: no copy, and the latest op is still GIVEN_UP
    copies = [
        m
        for m in read_messages(bootstrap, names.half, txn.partition)
        if m.key() == txn.txn_id.encode() and Header.ORIGIN_OFFSET.value in headers(m)
    ]
    assert copies == []
    ops = [
        decode_op(m.key(), m.value())
        for m in read_messages(bootstrap, names.op, txn.partition)
        if m.key() == txn.txn_id.encode()
    ]
    assert [o.state for o in ops] == [OpState.GIVEN_UP]


class Refused(NamedTuple):
    code: int
    err: str
    #: Records on the half topic before the resume.
    halves: int


def _given_up_then_resumed(
    cli: Cli, operator_env: dict[str, str], settings: OutboxSettings, writer: Writer, txn: Any
) -> Refused:
    """Its dead letter written (and flushed here), the transaction given up; resume it."""
    assert writer.producer.flush(30) == 0
    writer.op(txn, OpState.GIVEN_UP, by=DecidedBy.CHECKER, reason="still UNKNOWN")
    halves = len(read_messages(settings.bootstrap_servers, settings.topics.half))
    result = cli("resume", txn.txn_id, env=operator_env)
    return Refused(result.code, result.err, halves)

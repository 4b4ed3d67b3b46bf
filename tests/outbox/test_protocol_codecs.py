"""Half and op records: round trips, and decoding errors that name what is wrong."""

from __future__ import annotations

import pickle
import time
import uuid
from collections.abc import Callable
from dataclasses import FrozenInstanceError, fields

import orjson
import pytest

from outbox.errors import ProtocolError, UnknownSchemaVersionError
from outbox.protocol import (
    HALF_FIELDS,
    HALF_SCHEMA_VERSIONS,
    DecidedBy,
    HalfMessage,
    HalfRecord,
    OpRecord,
    OpState,
    decode_half,
    decode_op,
    encode_half_headers,
    encode_op,
    new_transaction_id,
    validate_transaction_id,
    why_incomplete,
)
from outbox.protocol.copies import copy_headers
from outbox.protocol.dead_letter import MAX_REASON_CHARS, DeadLetterHeader, dead_letter_headers
from outbox.protocol.headers import Header
from outbox.protocol.partitioning import murmur2, partition_for

TXN = new_transaction_id()


def headers(version: int = 1, **changes: bytes | None) -> list[tuple[str, bytes]]:
    """A half record's headers of ``version``, with the named headers replaced (None: left out)."""
    message = HalfMessage("orders", b"v", b"k", (("app", b"1"),))
    pairs = encode_half_headers(
        txn_id=TXN,
        producer_group="g",
        message=message,
        index=2,
        count=3,
        created_at_ms=7,
        schema_version=version,
    )
    out = [(n, changes.get(n, v)) for n, v in pairs if changes.get(n, v) is not None]
    return out  # type: ignore[return-value]


def packed(**changes: bytes | None) -> list[tuple[str, bytes]]:
    """Version-2 headers with the named fields of ``outbox-half`` replaced (None: left out)."""
    out = []
    for name, value in headers(2):
        if name == "outbox-half":
            fields = dict(zip(HALF_FIELDS, value.split(b"\x1f"), strict=True)) | changes
            value = b"\x1f".join(v for v in fields.values() if v is not None)
        out.append((name, value))
    return out


@pytest.mark.parametrize("version", HALF_SCHEMA_VERSIONS)
def test_a_half_record_round_trips_with_the_users_headers_first(version: int) -> None:
    written = headers(version)
    assert written[0] == ("app", b"1")
    record = decode_half(value=b"v", headers=written, partition=1, offset=9)
    assert (record.txn_id, record.index, record.count, record.message.topic) == (
        TXN,
        2,
        3,
        "orders",
    )
    assert record.message.key == b"k" and record.message.headers == (("app", b"1"),)
    assert record.original_offset == 9 and not record.is_copy
    assert record.schema_version == version


def test_version_2_packs_the_fields_into_one_header_and_keeps_the_key_apart() -> None:
    names = [name for name, _ in headers(2)]
    assert names == ["app", "outbox-half", "outbox-real-key"]
    keyless = HalfMessage("orders", b"v", None)
    pairs = encode_half_headers(
        txn_id=TXN, producer_group="g", message=keyless, index=0, count=None, created_at_ms=7
    )
    assert [n for n, _ in pairs] == ["outbox-half"]
    record = decode_half(value=None, headers=pairs)
    assert (record.message.key, record.count, record.check_immunity_s) == (None, None, None)


@pytest.mark.parametrize("version", HALF_SCHEMA_VERSIONS)
def test_a_copy_is_written_in_its_originals_version(version: int) -> None:
    original = decode_half(value=b"v", headers=headers(version), partition=1, offset=9)
    copy = decode_half(value=b"v", headers=copy_headers(original), partition=1, offset=20)
    assert (copy.schema_version, copy.origin_offset, copy.check_count) == (version, 9, 0)
    again = copy_headers(copy, check_count=4)  # resume: same version, count set, origin kept
    reread = decode_half(value=b"v", headers=again, partition=1, offset=30)
    assert (reread.schema_version, reread.origin_offset, reread.check_count) == (version, 9, 4)
    assert reread.message == original.message and reread.index == original.index


@pytest.mark.parametrize("version", HALF_SCHEMA_VERSIONS)
def test_a_resumed_copy_keeps_headers_this_version_does_not_know(version: int) -> None:
    """``resume`` rewrites the check count only: a header a newer writer or a tracing layer
    added, and a user header repeated, stay as they were, where they were."""
    written = [("app", b"2"), *headers(version), ("outbox-trace", b"t-1")]
    original = decode_half(value=b"v", headers=written, partition=1, offset=9)
    again = copy_headers(original, check_count=5)
    assert [n for n, _ in again] == [*(n for n, _ in written), "outbox-origin-offset"]
    assert ("outbox-trace", b"t-1") in again
    assert [v for n, v in again if n == "app"] == [b"2", b"1"]
    reread = decode_half(value=b"v", headers=again, partition=1, offset=30)
    assert (reread.check_count, reread.origin_offset, reread.txn_id) == (5, 9, TXN)


@pytest.mark.parametrize(
    ("written", "message"),
    [
        # version 1: the header is named
        (headers(1, **{"outbox-txn-id": None}), "lacks the outbox-txn-id header"),
        (
            headers(1, **{"outbox-message-index": b"two"}),
            "outbox-message-index='two' is not an integer",
        ),
        (headers(1, **{"outbox-txn-id": b"NOT-A-UUID"}), "'NOT-A-UUID' is not a UUID"),
        (headers(1, **{"outbox-real-topic": b"\xff"}), "header outbox-real-topic is not UTF-8"),
        # version 2: the field of outbox-half is named
        (packed(txn_id=None), "outbox-half has 8 fields; version 2 has 9"),
        (packed(message_index=b"two"), "message_index=b'two' is not a decimal integer"),
        (packed(message_count=b"-"), "message_count=b'-' is not a decimal integer"),
        (packed(txn_id=b"NOT-A-UUID"), "'NOT-A-UUID' is not a UUID"),
        (packed(real_topic=b"\xff"), "real_topic is not UTF-8"),
        (packed(producer_group=b""), "producer_group in header outbox-half is empty"),
        (packed(real_topic=b""), "real_topic in header outbox-half is empty"),
        # the first bad field is named, not a good one that merely is not all digits
        (packed(message_index=b"-1", created_at_ms=b"x"), "created_at_ms=b'x' is not a"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_malformed_half_record_is_refused_naming_the_header_or_field(
    written: list[tuple[str, bytes]], message: str
) -> None:
    with pytest.raises(ProtocolError, match=message.replace("(", r"\(")) as raised:
        decode_half(value=b"v", headers=written, partition=1, offset=9)
    assert "partition 1 offset 9" in str(raised.value)


def test_a_version_1_record_claiming_version_2_is_malformed_not_from_the_future() -> None:
    with pytest.raises(ProtocolError, match="version-2 record carries its fields in outbox-half"):
        decode_half(value=b"v", headers=headers(1, **{"outbox-schema-version": b"2"}))


def test_a_bad_origin_offset_on_a_version_2_copy_is_refused() -> None:
    bad = [*packed(), ("outbox-origin-offset", b"x")]
    with pytest.raises(ProtocolError, match="outbox-origin-offset='x' is not an integer"):
        decode_half(value=b"v", headers=bad, partition=1, offset=9)


@pytest.mark.parametrize(
    ("written", "message"),
    [
        (headers(1, **{"outbox-schema-version": b"3"}), "schema version b'3';"),
        (packed(schema_version=b"3"), "schema version b'3' in its outbox-half header"),
        ([("app", b"1")], "has neither an outbox-half nor an outbox-schema-version header"),
    ],
    ids=["version-1-header", "outbox-half", "neither"],
)
def test_an_unknown_schema_version_is_refused_never_guessed(
    written: list[tuple[str, bytes]], message: str
) -> None:
    with pytest.raises(UnknownSchemaVersionError, match=message):
        decode_half(value=b"v", headers=written)


def test_a_version_no_reader_knows_is_never_written_nor_a_group_the_fields_cannot_hold() -> None:
    message = HalfMessage("orders", b"v", None)
    common = {"txn_id": TXN, "message": message, "index": 0, "count": 1, "created_at_ms": 7}
    with pytest.raises(UnknownSchemaVersionError, match="use one of 1, 2"):
        encode_half_headers(producer_group="g", schema_version=3, **common)  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="contains a control character"):
        encode_half_headers(producer_group="a\x1fb", **common)  # type: ignore[arg-type]


def test_transaction_ids_must_be_canonical_lowercase_uuids() -> None:
    assert validate_transaction_id(TXN) == TXN
    with pytest.raises(ProtocolError, match="canonical lowercase"):
        validate_transaction_id(TXN.upper())
    with pytest.raises(ProtocolError, match="must be a UUID string"):
        validate_transaction_id(42)


def test_new_transaction_ids_are_canonical_uuid7_carrying_their_time() -> None:
    slack_ms = 60_000  # the wall clock may be stepped meanwhile (NTP); not by a minute
    before = time.time_ns() // 1_000_000 - slack_ms
    ids = [new_transaction_id() for _ in range(2_000)]
    after = time.time_ns() // 1_000_000 + slack_ms
    for txn_id in ids:
        parsed = uuid.UUID(txn_id)
        assert str(parsed) == validate_transaction_id(txn_id) == txn_id
        assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
        assert before <= parsed.int >> 80 <= after
        assert txn_id[:8] + txn_id[9:13] == f"{parsed.int >> 80:012x}"  # the milliseconds lead
    assert len(set(ids)) == len(ids)


#: Kafka's own vectors (``org.apache.kafka.common.utils.UtilsTest.testMurmur2``): a half record's
#: partition must be the one the Java client's default partitioner picks for its key.
JAVA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}

#: What ``Utils.murmur2`` of kafka-clients 4.2.1 returned (run in jshell) for what Kafka's vectors
#: leave out: the empty key, a one-byte tail, bytes above 0x7f (signed in Java) in the words and
#: in the tail, and a 36-character transaction id, the key of a transaction with no key of its own.
JAVA_MURMUR2_EDGES = {
    b"": 275646681,
    b"a": -1563381124,
    b"hello": 2132663229,
    b"\xff": -311467685,
    b"\x80\x81\xfe": 796990047,
    b"\xff\xfe\xfd\xfc\x90": 1485204560,
    b"0190a3b2-7c4d-7e5f-8a6b-1c2d3e4f5a6b": -157026855,
}


@pytest.mark.parametrize(("key", "expected"), [*JAVA_MURMUR2.items(), *JAVA_MURMUR2_EDGES.items()])
def test_murmur2_is_the_java_clients(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected
    assert partition_for(key, 12) == (expected & 0x7FFFFFFF) % 12


def test_an_op_record_round_trips_and_a_bad_one_is_refused() -> None:
    op = OpRecord(TXN, OpState.COMMIT, "g", 1, (4, 5), DecidedBy.CHECKER, 10, reason="r")
    key, value = encode_op(op)
    assert decode_op(key, value) == op
    assert decode_op(key, None) is None  # a tombstone
    with pytest.raises(ProtocolError, match="not a JSON document"):
        decode_op(key, b"{nope")
    with pytest.raises(UnknownSchemaVersionError, match="schema version 9"):
        decode_op(key, value.replace(b'"v":1', b'"v":9'))
    with pytest.raises(ProtocolError, match="differs from its txn_id"):
        decode_op(b"other", value)


@pytest.mark.parametrize(
    ("change", "value"),
    [
        ("NaN for a number", (b'"decided_at_ms":10', b'"decided_at_ms":NaN')),
        ("infinity for a number", (b'"decided_at_ms":10', b'"decided_at_ms":1e400')),
        ("a lone surrogate", (b'"reason":"r"', b'"reason":"\\ud800"')),
        ("bytes that are not UTF-8", (b'"reason":"r"', b'"reason":"\xff"')),
    ],
)
def test_an_op_document_json_does_not_allow_is_refused_where_it_was_read(
    change: str, value: tuple[bytes, bytes]
) -> None:
    # Python's json module reads the first three; a reason with a lone surrogate would then
    # fail wherever it is written out (logs, the dead-letter topic), far from the record.
    op = OpRecord(TXN, OpState.COMMIT, "g", 1, (4,), DecidedBy.CHECKER, 10, reason="r")
    key, written = encode_op(op)
    assert value[0] in written, change
    with pytest.raises(ProtocolError, match="op record at partition 2 offset 7 is not a JSON"):
        decode_op(key, written.replace(*value), partition=2, offset=7)


@pytest.mark.parametrize(
    ("written", "replaced", "named"),
    [
        (b'"partition":1', b'"partition":"1"', "half.partition is '1'"),
        (b'"partition":1', b'"partition":1.7', "half.partition is 1.7"),
        (b'"partition":1', b'"partition":-1', "half.partition is -1"),
        (b'"partition":1', b'"partition":true', "half.partition is True"),
        (b'"offsets":[4]', b'"offsets":"4"', "half.offsets is '4'"),
        (b'"offsets":[4]', b'"offsets":[4.0]', "half.offsets holds 4.0"),
        (b'"offsets":[4]', b'"offsets":[4,-1]', "half.offsets holds -1"),
        # past 64 bits, which orjson reads as a float: refused rather than rounded
        (b'"offsets":[4]', b'"offsets":[1180591620717411303424]', "half.offsets holds 1.18"),
        (b'"decided_at_ms":10', b'"decided_at_ms":"10"', "decided_at_ms is '10'"),
        (b'"reason":"r"', b'"reason":5', "reason is 5"),
    ],
)
def test_an_op_number_that_is_not_a_json_integer_is_refused_by_name(
    written: bytes, replaced: bytes, named: str
) -> None:
    op = OpRecord(TXN, OpState.COMMIT, "g", 1, (4,), DecidedBy.CHECKER, 10, reason="r")
    key, value = encode_op(op)
    assert written in value
    with pytest.raises(ProtocolError, match="malformed field") as raised:
        decode_op(key, value.replace(written, replaced), partition=2, offset=7)
    assert named in str(raised.value)
    assert "op record at partition 2 offset 7" in str(raised.value)


def op_value(**changes: object) -> bytes:
    """A valid op document with the named top-level fields replaced."""
    op = OpRecord(TXN, OpState.COMMIT, "g", 1, (4,), DecidedBy.CHECKER, 10, reason="r")
    return orjson.dumps(orjson.loads(encode_op(op)[1]) | changes)


def test_an_op_reason_outside_ascii_round_trips() -> None:
    op = OpRecord(TXN, OpState.ROLLBACK, "g", 1, (4,), DecidedBy.CHECKER, 10, reason="naïve ✓")
    key, value = encode_op(op)
    assert "naïve ✓".encode() in value  # UTF-8, as the JSON text of the document
    assert decode_op(key, value) == op


@pytest.mark.parametrize("version", HALF_SCHEMA_VERSIONS)
def test_decoded_records_are_what_their_constructors_build_every_field_set_and_frozen(
    version: int,
) -> None:
    # The decoders fill the instances directly (outbox.protocol.frozen); a field left out
    # there would read as the class default, which these comparisons would show.
    written = headers(version)
    record = decode_half(value=b"v", headers=written, partition=1, offset=9, timestamp_ms=5)
    built = HalfRecord(
        txn_id=TXN,
        producer_group="g",
        message=HalfMessage("orders", b"v", b"k", (("app", b"1"),)),
        index=2,
        count=3,
        created_at_ms=7,
        check_count=0,
        check_immunity_s=None,
        origin_offset=None,
        schema_version=version,
        partition=1,
        offset=9,
        timestamp_ms=5,
        raw_headers=tuple(written),
    )
    assert record == built and hash(record) == hash(built)
    assert vars(record).keys() == {f.name for f in fields(HalfRecord)}
    assert vars(record.message).keys() == {f.name for f in fields(HalfMessage)}
    assert pickle.loads(pickle.dumps(record)) == record
    op = OpRecord(TXN, OpState.ROLLBACK, "g", 1, (4,), DecidedBy.PRODUCER, 10)
    decoded = decode_op(*encode_op(op), partition=1, offset=3)
    assert decoded is not None
    assert decoded == op and (decoded.partition, decoded.offset) == (1, 3)
    assert vars(decoded).keys() == {f.name for f in fields(OpRecord)}
    for frozen_one in (record, record.message, decoded):
        with pytest.raises(FrozenInstanceError):
            frozen_one.partition = 0  # type: ignore[misc]


def _indexed(*indexes: int, count: int | None = None) -> list[HalfRecord]:
    return [
        HalfRecord(
            txn_id=new_transaction_id(),
            producer_group="orders",
            message=HalfMessage("orders", b"v"),
            index=index,
            count=count,
            created_at_ms=0,
            check_count=0,
        )
        for index in indexes
    ]


@pytest.mark.parametrize(
    ("records", "why"),
    [
        (_indexed(0), None),
        (_indexed(2, 0, 1), None),  # in any order
        (_indexed(0, 1, count=2), None),
        ([], "none of its half records is in hand"),
        (_indexed(0, 2), "1 of its 3 messages is missing (index 1)"),
        (_indexed(1, 3), "2 of its 4 messages are missing (index 0, 2)"),
        (_indexed(0, count=3), "2 of its 3 messages are missing (index 1, 2)"),
        (_indexed(0, 1, count=1), "message index 1 is past its message count 1"),
        (
            [*_indexed(0, count=2), *_indexed(1, count=3)],
            "its half records disagree on its message count ([2, 3])",
        ),
        (
            _indexed(12, count=13),
            "12 of its 13 messages are missing (index 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, ...)",
        ),
        (_indexed(-1, 0), "message index -1 is negative"),
        (  # a count no memory could list: the answer costs what the records in hand cost
            _indexed(0, 2, count=10**12),
            "999999999998 of its 1000000000000 messages are missing "
            "(index 1, 3, 4, 5, 6, 7, 8, 9, 10, 11, ...)",
        ),
    ],
)
def test_a_transaction_is_whole_only_with_every_index_up_to_its_count(
    records: list[HalfRecord], why: str | None
) -> None:
    assert why_incomplete(records) == why
    assert why_incomplete(iter(records)) == why  # read once, any iterable


@pytest.mark.parametrize(
    ("decode", "names"),
    [
        (  # repr() of binary bytes is four times their size: 1.2 million characters
            lambda: decode_half(
                value=b"v",
                headers=headers(1, **{Header.MESSAGE_INDEX.value: b"\x00" * 300_000}),
                partition=1,
                offset=9,
            ),
            "header outbox-message-index='\\x00",
        ),
        (
            lambda: decode_half(
                value=b"v", headers=headers(1, **{"outbox-txn-id": b"t" * 300_000}), offset=9
            ),
            "transaction id 'ttt",
        ),
        (lambda: decode_op(None, op_value(state="Z" * 300_000)), "KeyError('ZZZ"),
        (
            lambda: decode_op(None, op_value(half={"partition": 1, "offsets": "4" * 300_000})),
            "'444",
        ),
        (lambda: decode_op(None, op_value(reason=[1] * 300_000)), "reason is [1, 1"),
        (lambda: decode_op(None, op_value(v="9" * 300_000)), "schema version '999"),
        (lambda: decode_op(b"k" * 300_000, op_value()), "key b'kkk"),
    ],
)
def test_a_huge_malformed_field_is_quoted_in_part(decode: Callable[[], object], names: str) -> None:
    """A message names the value it refuses, but not all of it: the log line and the dead
    letter carrying the message stay small."""
    with pytest.raises(ProtocolError) as raised:
        decode()
    message = str(raised.value)
    assert names in message
    assert len(message) < 600
    assert "more characters)" in message


def test_a_long_reason_is_cut_in_the_dead_letter() -> None:
    # Uncut, a reason alone could pass a topic's 1 MB limit, and the dead letter would be
    # refused however often it is redone.
    reason = "x" * 1_200_000
    letter = dict(
        dead_letter_headers(
            None, reason=reason, source_topic="t", source_partition=1, source_offset=9
        )
    )
    kept = letter[DeadLetterHeader.REASON.value]
    assert isinstance(kept, bytes)
    assert kept.startswith(reason[:MAX_REASON_CHARS].encode())
    assert kept.endswith(f"... ({len(reason) - MAX_REASON_CHARS:,} more characters cut)".encode())
    short = dict(
        dead_letter_headers(None, reason="r", source_topic="t", source_partition=1, source_offset=9)
    )
    assert short[DeadLetterHeader.REASON.value] == b"r"

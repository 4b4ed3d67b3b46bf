"""Raw Kafka rows -> typed rows: the protocol's headers and op JSON, read without guessing."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from checker.audit import records
from checker.audit.plan import InRange
from checker.audit.source import RAW_SCHEMA
from outbox.errors import ProtocolError
from outbox.protocol import (
    HALF_SCHEMA_VERSIONS,
    HalfMessage,
    decode_half,
    encode_half_headers,
    new_transaction_id,
)

pytestmark = pytest.mark.integration  # starts Spark (a JVM), no Kafka

AS_OF = 1_795_000_100_000


def at(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


def raw(spark, rows):
    """Rows of (key, value, partition, offset, ms, headers) as Spark's Kafka source gives them."""
    full = [(k, v, "t", p, o, at(ms), 1, h) for k, v, p, o, ms, h in rows]
    return spark.createDataFrame(full, RAW_SCHEMA)


def half_headers(
    txn_id: str,
    index: int = 0,
    key: bytes | None = b"k",
    version: int = 2,
    check_by: str = "evidence",
    **extra: bytes,
):
    headers = encode_half_headers(
        txn_id=txn_id,
        producer_group="orders",
        message=HalfMessage("orders-topic", b"v", key, (("trace", b"1"),)),
        index=index,
        count=2,
        created_at_ms=5,
        schema_version=version,
        check_by=check_by,
    )
    return headers + list(extra.items())


def of_version_3(name: str, value: bytes) -> bytes:
    if name == "outbox-schema-version":
        return b"3"
    return b"3" + value[1:] if name == "outbox-half" else value


@pytest.fixture(params=[True, False], ids=["ansi", "ansi-off"])
def ansi(spark, request):
    """Spark's ANSI mode on (its default) and off: some functions answer nulls differently."""
    before = spark.conf.get("spark.sql.ansi.enabled")
    spark.conf.set("spark.sql.ansi.enabled", str(request.param).lower())
    yield request.param
    spark.conf.set("spark.sql.ansi.enabled", before)


def decodes(headers) -> bool:
    try:
        decode_half(value=b"v", headers=headers)
    except ProtocolError:
        return False
    return True


@pytest.mark.parametrize("version", HALF_SCHEMA_VERSIONS)
def test_half_records_are_typed_from_their_headers_and_bad_ones_carry_the_problem(
    spark, ansi: bool, version: int
) -> None:
    good, copy, keyless = new_transaction_id(), new_transaction_id(), new_transaction_id()
    future = new_transaction_id()

    def headers(txn_id: str, index: int = 0, key: bytes | None = b"k", **extra: bytes):
        return half_headers(txn_id, index, key, version, **extra)

    unknown = [(n, of_version_3(n, v)) for n, v in headers(good)]
    repeated = [("trace", b"1"), *headers(keyless, key=None), ("trace", b"2")]
    short = [("outbox-half", b"\x1f".join([b"2", good.encode(), b"orders", b"t", b"0"]))]
    rows = [
        (good.encode(), b"v", 1, 10, AS_OF - 10, headers(good, 1)),
        (
            copy.encode(),
            b"v",
            1,
            11,
            AS_OF - 9,
            headers(copy, **{"outbox-origin-offset": b"3"}),
        ),
        (keyless.encode(), b"v", 1, 12, AS_OF - 8, repeated),
        (good.encode(), b"v", 1, 13, AS_OF - 7, unknown),
        (b"x", b"v", 1, 14, AS_OF - 6, [("outbox-schema-version", b"1")]),
        (future.encode(), b"v", 1, 15, AS_OF + 1, headers(future)),
        (good.encode(), b"v", 1, 16, AS_OF - 5, short),
        (b"x", b"v", 1, 17, AS_OF - 4, [("trace", b"1")]),
        (good.encode(), b"v", 1, 18, AS_OF - 3, half_headers(good, version=1)),
        (
            good.encode(),
            b"v",
            1,
            19,
            AS_OF - 3,
            [("outbox-half", None), *half_headers(good, version=1)],
        ),
        (good.encode(), b"v", 1, 20, AS_OF - 3, half_headers(good, version=2)),
    ]
    rows[-3] = (
        *rows[-3][:5],
        [(n, b"2" if n == "outbox-schema-version" else v) for n, v in rows[-3][5]],
    )
    empty_group = rows[-1][5][1][1].replace(b"\x1forders\x1f", b"\x1f\x1f")
    rows[-1] = (*rows[-1][:5], [rows[-1][5][0], ("outbox-half", empty_group)])
    typed = records.halves(raw(spark, rows), InRange(start_ms=AS_OF - 9), as_of_ms=AS_OF)

    by_offset = {r.offset: r for r in typed.collect()}
    assert set(by_offset) == {10, 11, 12, 13, 14, 16, 17, 18, 19, 20}  # 15: after the clock
    # the audit accepts exactly the records the relay and the checker can read
    for _, _, _, offset, _, written in rows:
        if offset in by_offset:
            assert (by_offset[offset].problem is None) is decodes(written), offset
    first = by_offset[10]
    assert (first.txn_id, first.producer_group, first.real_topic) == (
        good,
        "orders",
        "orders-topic",
    )
    assert (bytes(first.real_key), first.message_index, first.message_count) == (b"k", 1, 2)
    assert (first.problem, first.in_range, first.origin_offset) == (None, False, None)
    assert first.check_count == 0
    assert by_offset[11].origin_offset == 3 and by_offset[11].in_range
    assert by_offset[12].real_key is None and by_offset[12].problem is None
    assert by_offset[13].problem == "unknown schema version 3"
    assert by_offset[14].problem == "bad txn_id"
    assert by_offset[16].problem == "header outbox-half has 5 fields, not 9"
    assert by_offset[17].problem == "no outbox-half or outbox-schema-version header"
    assert by_offset[18].problem == "outbox-schema-version 2 without an outbox-half header"
    assert by_offset[19].problem == "unknown schema version "  # outbox-half with a null value
    assert by_offset[20].problem == "no producer_group"
    bad = records.unreadable(typed, "half").collect()
    assert {(r.offset, r.problem) for r in bad} == {
        (13, "unknown schema version 3"),
        (14, "bad txn_id"),
        (16, "header outbox-half has 5 fields, not 9"),
        (17, "no outbox-half or outbox-schema-version header"),
        (18, "outbox-schema-version 2 without an outbox-half header"),
        (19, "unknown schema version "),
        (20, "no producer_group"),
    }


@pytest.mark.parametrize("version", HALF_SCHEMA_VERSIONS)
def test_half_records_say_what_answers_their_checks_evidence_when_they_do_not(
    spark, version: int
) -> None:
    t = new_transaction_id()
    origin = {"outbox-origin-offset": b"0"}
    rows = [
        (t.encode(), b"v", 0, 0, AS_OF - 5, half_headers(t, version=version)),
        (t.encode(), b"v", 0, 1, AS_OF - 5, half_headers(t, version=version, check_by="listener")),
        (
            t.encode(),
            b"v",
            0,
            2,
            AS_OF - 5,
            half_headers(t, version=version, check_by="listener", **origin),
        ),
        (t.encode(), b"v", 0, 3, AS_OF - 5, half_headers(t, version=version, check_by="oracle")),
        (
            t.encode(),
            b"v",
            0,
            4,
            AS_OF - 5,
            half_headers(t, version=version, **{"outbox-check-by": b"evidence"}),
        ),
    ]
    typed = records.halves(raw(spark, rows), InRange(), as_of_ms=AS_OF)

    by_offset = {r.offset: (r.check_by, r.problem) for r in typed.collect()}
    assert by_offset == {
        0: ("evidence", None),  # no header: the decorator and context-manager forms
        1: ("listener", None),
        2: ("listener", None),  # a put-back copy carries it over
        3: ("oracle", None),  # a value of a newer producer: kept, never guessed at
        4: ("evidence", None),
    }
    for _, _, _, offset, _, written in rows:
        assert decode_half(value=b"v", headers=written).check_by == by_offset[offset][0]


def op_value(txn_id: str, **changes) -> bytes:
    doc = {
        "v": 1,
        "txn_id": txn_id,
        "state": "COMMIT",
        "producer_group": "orders",
        "half": {"partition": 1, "offsets": [10, 11]},
        "message_count": 2,
        "decided_by": "producer",
        "decided_at_ms": 7,
    }
    doc.update(changes)
    return json.dumps(doc).encode()


def test_op_records_are_parsed_and_unknown_versions_or_malformed_ones_are_flagged(spark) -> None:
    t = new_transaction_id()
    rows = [
        (t.encode(), op_value(t, reason="why"), 1, 0, AS_OF - 5, []),
        (t.encode(), op_value(t, v=2), 1, 1, AS_OF - 5, []),
        (t.encode(), b"{not json", 1, 2, AS_OF - 5, []),
        (t.encode(), None, 1, 3, AS_OF - 5, []),
        (b"other", op_value(t), 1, 4, AS_OF - 5, []),
        (t.encode(), op_value(t, state="MAYBE"), 1, 5, AS_OF - 5, []),
        (t.encode(), op_value(t, half={"partition": 1, "offsets": [-1]}), 1, 6, AS_OF - 5, []),
    ]
    typed = records.ops(raw(spark, rows), InRange(), as_of_ms=AS_OF)

    by_offset = {r.offset: r for r in typed.collect()}
    assert 3 not in by_offset  # a tombstone decides nothing
    ok = by_offset[0]
    assert (ok.state, ok.half_partition, ok.half_offsets, ok.message_count) == (
        "COMMIT",
        1,
        [10, 11],
        2,
    )
    assert (ok.decided_by, ok.decided_at_ms, ok.reason, ok.problem) == ("producer", 7, "why", None)
    assert by_offset[1].problem == "unknown schema version 2"
    assert by_offset[2].problem.startswith("not an op document")
    assert by_offset[4].problem == "key differs from txn_id"
    assert by_offset[5].problem == "unknown state"
    assert by_offset[6].problem == "bad half field"  # no record has a negative offset


def test_promoted_records_keep_foreign_records_apart_and_dead_letters_name_their_txn(spark) -> None:
    t = new_transaction_id()
    ours = [
        ("outbox-txn-id", t.encode()),
        ("outbox-producer-group", b"orders"),
        ("outbox-message-index", b"1"),
    ]
    rows = [
        (b"k", b"v", 0, 0, AS_OF - 5, ours),
        (b"k", b"v", 0, 1, AS_OF - 5, []),
        (
            b"k",
            b"v",
            0,
            2,
            AS_OF - 5,
            [("outbox-txn-id", t.encode()), ("outbox-message-index", b"x")],
        ),
    ]
    typed = {
        r.offset: r for r in records.promoted(raw(spark, rows), InRange(), as_of_ms=AS_OF).collect()
    }
    assert (typed[0].txn_id, typed[0].message_index, typed[0].problem) == (t, 1, None)
    assert typed[1].txn_id is None and typed[1].problem is None
    assert typed[2].problem == "bad outbox-message-index header"

    packed = new_transaction_id()  # a given-up half record of version 2, parked whole
    letters = raw(
        spark,
        [
            (t.encode(), b"v", 0, 0, AS_OF - 5, [*ours, ("outbox-dl-reason", b"gone")]),
            (None, b"junk", 0, 1, AS_OF - 5, [("outbox-dl-reason", b"bad")]),
            (  # an op the relay refused: its half records were gone
                t.encode(),
                op_value(t),
                0,
                3,
                AS_OF - 5,
                [
                    ("outbox-dl-reason", b"GAP"),
                    ("outbox-dl-source-topic", b"x-op"),
                    ("outbox-dl-source-partition", b"1"),
                    ("outbox-dl-source-offset", b"17"),
                ],
            ),
            (
                packed.encode(),
                b"v",
                0,
                2,
                AS_OF - 5,
                [*half_headers(packed, 3, version=2), ("outbox-dl-reason", b"given up")],
            ),
        ],
    )
    found = records.dead_letters(letters, as_of_ms=AS_OF, op_topic="x-op").collect()
    assert [(r.txn_id, r.message_index, r.reason, r.refused_op) for r in found] == [
        (t, 1, "gone", False),
        # an op the relay refused: its transaction is the op's where it came from (its own
        # key and value may be omitted), never read from a payload
        (None, None, "GAP", True),
        (packed, 3, "given up", False),
    ]
    assert (found[1].source_partition, found[1].source_offset) == (1, 17)

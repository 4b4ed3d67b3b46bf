"""Half and op records: round trips, and decoding errors that name what is wrong."""

from __future__ import annotations

import pickle
from dataclasses import FrozenInstanceError, fields

import pytest

from outbox.errors import ProtocolError, UnknownSchemaVersionError
from outbox.protocol import (
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
)

TXN = new_transaction_id()


def headers(**changes: bytes | None) -> list[tuple[str, bytes]]:
    message = HalfMessage("orders", b"v", b"k", (("app", b"1"),))
    pairs = encode_half_headers(
        txn_id=TXN, producer_group="g", message=message, index=2, count=3, created_at_ms=7
    )
    out = [(n, changes.get(n, v)) for n, v in pairs if changes.get(n, v) is not None]
    return out  # type: ignore[return-value]


def test_a_half_record_round_trips_with_the_users_headers_first() -> None:
    record = decode_half(value=b"v", headers=headers(), partition=1, offset=9)
    assert (record.txn_id, record.index, record.count, record.message.topic) == (
        TXN,
        2,
        3,
        "orders",
    )
    assert record.message.key == b"k" and record.message.headers == (("app", b"1"),)
    assert record.original_offset == 9 and not record.is_copy


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"outbox-txn-id": None}, "lacks the outbox-txn-id header"),
        ({"outbox-message-index": b"two"}, "outbox-message-index='two' is not an integer"),
        ({"outbox-txn-id": b"NOT-A-UUID"}, "'NOT-A-UUID' is not a UUID"),
        ({"outbox-real-topic": b"\xff"}, "header outbox-real-topic is not UTF-8"),
    ],
)
def test_a_malformed_half_record_is_refused_naming_the_header(
    change: dict[str, bytes | None], message: str
) -> None:
    with pytest.raises(ProtocolError, match=message.replace("(", r"\(")) as raised:
        decode_half(value=b"v", headers=headers(**change), partition=1, offset=9)
    assert "partition 1 offset 9" in str(raised.value) or "UUID" in message


def test_an_unknown_schema_version_is_refused_never_guessed() -> None:
    with pytest.raises(UnknownSchemaVersionError, match="schema version b'2'"):
        decode_half(value=b"v", headers=headers(**{"outbox-schema-version": b"2"}))


def test_transaction_ids_must_be_canonical_lowercase_uuids() -> None:
    assert validate_transaction_id(TXN) == TXN
    with pytest.raises(ProtocolError, match="canonical lowercase"):
        validate_transaction_id(TXN.upper())
    with pytest.raises(ProtocolError, match="must be a UUID string"):
        validate_transaction_id(42)


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


def test_decoded_records_are_what_their_constructors_build_every_field_set_and_frozen() -> None:
    # The decoders fill the instances directly (outbox.protocol.frozen); a field left out
    # there would read as the class default, which these comparisons would show.
    record = decode_half(value=b"v", headers=headers(), partition=1, offset=9, timestamp_ms=5)
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
        partition=1,
        offset=9,
        timestamp_ms=5,
        raw_headers=tuple(headers()),
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

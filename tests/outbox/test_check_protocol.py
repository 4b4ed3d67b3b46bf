"""The check request on the wire (outbox.protocol.check): what the checker sends is what the
endpoint reads, size-bounded, and malformed requests are refused by field."""

from __future__ import annotations

import orjson
import pytest

from outbox.errors import ProtocolError
from outbox.protocol import HalfMessage, HalfRecord, new_transaction_id
from outbox.protocol.check import (
    CheckedTransaction,
    decode_request,
    encode_request,
    split_requests,
)
from outbox.protocol.states import CheckBy


def half(txn_id: str, value: bytes | None, *, key: bytes | None = b"order-7") -> HalfRecord:
    return HalfRecord(
        txn_id=txn_id,
        producer_group="orders",
        message=HalfMessage("orders-events", value, key, (("trace", b"t\x00\xff"),)),
        index=0,
        count=2,
        created_at_ms=1_795_000_000_000,
        check_count=0,
        check_by=CheckBy.LISTENER,
        partition=3,
        offset=120,
    )


def test_a_request_round_trips_with_its_half_messages() -> None:
    first, second, bare = (new_transaction_id() for _ in range(3))
    asked = [
        CheckedTransaction(first, CheckBy.LISTENER, 2, half(first, b"\x00binary\xff")),
        CheckedTransaction(second, CheckBy.LISTENER, 0, half(second, None, key=None)),
        CheckedTransaction(bare),
    ]
    body = encode_request(asked, nonce="ab" * 16, instance_id="i-1", max_bytes=65536)

    request = decode_request(body)

    assert request.nonce == "ab" * 16 and request.instance_id == "i-1"
    assert request.txn_ids == [first, second, bare]
    got = {t.txn_id: t for t in request.transactions}
    assert got[first].half is not None and got[first].check_times == 2
    assert got[first].half.message == asked[0].half.message  # type: ignore[union-attr]
    assert (got[first].half.partition, got[first].half.offset) == (3, 120)
    assert got[first].half.check_by == CheckBy.LISTENER and got[first].half.count == 2
    assert got[second].half.message.value is None and got[second].half.message.key is None  # type: ignore[union-attr]
    assert got[bare] == CheckedTransaction(bare)


def test_a_request_of_the_first_version_reads_as_ids_checked_by_evidence() -> None:
    txn_id = new_transaction_id()
    request = decode_request(orjson.dumps({"txn_ids": [txn_id, txn_id]}))
    assert request.transactions == (CheckedTransaction(txn_id),)
    assert request.nonce is None and request.instance_id is None


def test_a_value_too_large_for_the_request_is_left_out_and_marked() -> None:
    txn_id = new_transaction_id()
    big = CheckedTransaction(txn_id, CheckBy.LISTENER, 0, half(txn_id, b"x" * 40_000))
    body = encode_request([big], nonce="n", instance_id=None, max_bytes=16_384)
    assert len(body) < 16_384
    [read] = decode_request(body).transactions
    assert read.value_omitted and read.half is not None and read.half.message.value is None
    assert read.half.message.key == b"order-7"


def test_requests_are_split_by_count_and_by_bytes() -> None:
    ids = [new_transaction_id() for _ in range(50)]
    asked = [CheckedTransaction(t, CheckBy.LISTENER, 0, half(t, b"v" * 3000)) for t in ids]
    by_count = split_requests(asked, max_ids=20, max_bytes=1 << 30)
    assert [len(b) for b in by_count] == [20, 20, 10]
    by_bytes = split_requests(asked, max_ids=1000, max_bytes=32_768)
    assert sum(len(b) for b in by_bytes) == 50 and len(by_bytes) > 1
    for batch in by_bytes:
        assert (
            len(encode_request(batch, nonce="n" * 32, instance_id="i", max_bytes=32_768)) <= 32_768
        )


MALFORMED = {
    "not an object": (b"[]", "JSON object"),
    "a stray transaction": (
        orjson.dumps({"txn_ids": [], "transactions": {new_transaction_id(): {}}}),
        "which txn_ids lacks",
    ),
    "a negative offset": (
        None,
        "offset must be a non-negative integer",
    ),
    "a value that is not base64": (None, "value is not base64"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_request_is_refused_naming_the_field(case: str) -> None:
    body, message = MALFORMED[case]
    if body is None:
        txn_id = new_transaction_id()
        asked = CheckedTransaction(txn_id, CheckBy.LISTENER, 0, half(txn_id, b"v"))
        document = orjson.loads(
            encode_request([asked], nonce="n", instance_id=None, max_bytes=4096)
        )
        entry = document["transactions"][txn_id]["half"]
        if case == "a negative offset":
            entry["offset"] = -1
        else:
            entry["value"] = "not base64!"
        body = orjson.dumps(document)
    with pytest.raises(ProtocolError, match=message):
        decode_request(body)

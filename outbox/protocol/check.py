"""Check requests and replies: what the checker asks a producer's check endpoint, on the wire.

``POST /outbox/check`` with one JSON document, signed (:mod:`outbox.checks.auth`)::

    {"txn_ids": ["<uuid>", ...],
     "nonce": "<32 hex digits>",
     "instance_id": "<the registration asked>",
     "transactions": {"<uuid>": {"check_by": "listener", "check_times": 2,
                                 "half": {<its first half record in hand>}}}}

``txn_ids`` is all an endpoint of version 1 reads, so a newer checker works with it. The
``transactions`` entries carry what RocketMQ's check request carries, the half message itself:
``check_by`` routes the check (the evidence row, or the group's listener), and ``half`` is what
``check_local_transaction(message)`` receives (see :class:`outbox.message.MessageView`). A value
too large for the request is left out (``"value_omitted": true``) and the endpoint reads it
from the half topic at the record's partition and offset. ``nonce`` makes every request's
signature unique, so an endpoint refuses a replay; ``instance_id`` binds the request to the
instance it was addressed to, so a request captured on its way to one instance is refused by
another. Both are ignored by endpoints of version 1.

Reply: ``{"states": {"<uuid>": "COMMIT" | "ROLLBACK" | "UNKNOWN", ...}}``. A refusal of a stale
timestamp carries the endpoint's clock (``"time"``, Unix seconds), so a checker can sign with
the endpoint's time: a producer host whose clock is off still answers.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from outbox.errors import ProtocolError, quoted
from outbox.protocol.half import HalfMessage, HalfRecord
from outbox.protocol.ids import validate_transaction_id
from outbox.protocol.states import CheckBy, LocalTransactionState

CHECK_PATH = "/outbox/check"

#: Bytes of a request that are not its transactions' entries (ids list aside): the nonce, the
#: instance id and the JSON around them, generously.
_ENVELOPE_BYTES = 512


@dataclass(frozen=True)
class CheckedTransaction:
    """One transaction a check asks about, with what the checker holds of it.

    Attributes:
        txn_id: the transaction id.
        check_by: what answers it (:class:`CheckBy`; another value from a newer producer).
        check_times: checks its producers answered so far (RocketMQ's TRANSACTION_CHECK_TIMES).
        half: its first half record in hand (lowest message index), or None when none is
            (a request from a checker of version 1 carries none).
        value_omitted: the half's value was too large for the request; read it from the half
            topic at ``half.partition`` and ``half.original_offset``.
    """

    txn_id: str
    check_by: str = CheckBy.EVIDENCE
    check_times: int = 0
    half: HalfRecord | None = None
    value_omitted: bool = False


@dataclass(frozen=True)
class CheckRequest:
    """A decoded request: its transactions in the order asked, and its anti-replay fields."""

    transactions: tuple[CheckedTransaction, ...]
    nonce: str | None = None
    instance_id: str | None = None

    @property
    def txn_ids(self) -> list[str]:
        return [t.txn_id for t in self.transactions]


def new_nonce() -> str:
    return os.urandom(16).hex()


def encode_request(
    transactions: Sequence[CheckedTransaction],
    *,
    nonce: str,
    instance_id: str | None,
    max_bytes: int,
) -> bytes:
    """One request body. A half value that would take the body past ``max_bytes`` is left out
    (the endpoint reads it from the half topic); call :func:`split_requests` first so the rest
    fits."""
    entries = {t.txn_id: _entry(t, max_bytes) for t in transactions}
    document: dict[str, Any] = {
        "txn_ids": [t.txn_id for t in transactions],
        "nonce": nonce,
        "transactions": entries,
    }
    if instance_id is not None:
        document["instance_id"] = instance_id
    return orjson.dumps(document)


def split_requests(
    transactions: Iterable[CheckedTransaction], *, max_ids: int, max_bytes: int
) -> list[list[CheckedTransaction]]:
    """Transactions grouped into requests of at most ``max_ids`` ids and ``max_bytes`` bytes."""
    batches: list[list[CheckedTransaction]] = []
    batch: list[CheckedTransaction] = []
    size = _ENVELOPE_BYTES
    for txn in transactions:
        cost = len(orjson.dumps(_entry(txn, max_bytes))) + len(txn.txn_id) * 2 + 8
        if batch and (len(batch) >= max_ids or size + cost > max_bytes):
            batches.append(batch)
            batch, size = [], _ENVELOPE_BYTES
        batch.append(txn)
        size += cost
    if batch:
        batches.append(batch)
    return batches


def _entry(txn: CheckedTransaction, max_bytes: int) -> dict[str, Any]:
    entry: dict[str, Any] = {"check_by": str(txn.check_by), "check_times": txn.check_times}
    half = txn.half
    if half is None:
        return entry
    message = half.message
    encoded: dict[str, Any] = {
        "group": half.producer_group,
        "topic": message.topic,
        "index": half.index,
        "count": half.count,
        "partition": half.partition,
        "offset": half.original_offset,
        "created_at_ms": half.created_at_ms,
        "key": _b64(message.key),
        "headers": [[name, _b64(value)] for name, value in message.headers],
    }
    value = message.value
    # base64 grows a value by a third; keep room for the rest of the entry
    if value is not None and (len(value) * 4) // 3 + 4 > max_bytes // 2:
        encoded["value_omitted"] = True
    else:
        encoded["value"] = _b64(value)
    entry["half"] = encoded
    return entry


def decode_request(body: bytes) -> CheckRequest:
    """Read a request of either version.

    Raises:
        ProtocolError: not the document above; the message names the field.
    """
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise ProtocolError(f"body is not JSON: {err}") from err
    if not isinstance(document, dict) or not isinstance(document.get("txn_ids"), list):
        raise ProtocolError('body must be a JSON object {"txn_ids": [...], ...}')
    ids = []
    for i, txn_id in enumerate(document["txn_ids"]):
        try:
            ids.append(validate_transaction_id(txn_id))
        except ProtocolError as err:
            raise ProtocolError(f"txn_ids[{i}]: {err}") from err
    entries = document.get("transactions", {})
    if not isinstance(entries, dict):
        raise ProtocolError('"transactions" must be an object keyed by transaction id')
    strays = set(entries) - set(ids)
    if strays:
        raise ProtocolError(f'"transactions" names {quoted(min(strays))}, which txn_ids lacks')
    transactions = tuple(_transaction(txn_id, entries.get(txn_id)) for txn_id in dict.fromkeys(ids))
    return CheckRequest(
        transactions,
        nonce=_optional_str(document, "nonce"),
        instance_id=_optional_str(document, "instance_id"),
    )


def _transaction(txn_id: str, entry: object) -> CheckedTransaction:
    if entry is None:
        return CheckedTransaction(txn_id)
    where = f"transactions[{txn_id}]"
    if not isinstance(entry, dict):
        raise ProtocolError(f"{where} must be an object")
    check_by = entry.get("check_by", CheckBy.EVIDENCE)
    if not isinstance(check_by, str):
        raise ProtocolError(f"{where}.check_by must be a string")
    check_times = _int(entry, "check_times", where, default=0)
    half = entry.get("half")
    if half is None:
        return CheckedTransaction(txn_id, check_by, check_times)
    if not isinstance(half, dict):
        raise ProtocolError(f"{where}.half must be an object")
    where += ".half"
    omitted = half.get("value_omitted") is True
    headers = half.get("headers", [])
    if not isinstance(headers, list) or not all(
        isinstance(h, list) and len(h) == 2 and isinstance(h[0], str) for h in headers
    ):
        raise ProtocolError(f"{where}.headers must be a list of [name, base64] pairs")
    count = half.get("count")
    record = HalfRecord(
        txn_id=txn_id,
        producer_group=_str(half, "group", where),
        message=HalfMessage(
            topic=_str(half, "topic", where),
            value=None if omitted else _bytes(half.get("value"), f"{where}.value"),
            key=_bytes(half.get("key"), f"{where}.key"),
            headers=tuple(
                (name, _bytes(value, f"{where}.headers[{name}]") or b"") for name, value in headers
            ),
        ),
        index=_int(half, "index", where),
        count=None if count is None else _int(half, "count", where),
        created_at_ms=_int(half, "created_at_ms", where),
        check_count=check_times,
        check_by=check_by,
        partition=_int(half, "partition", where),
        offset=_int(half, "offset", where),
    )
    return CheckedTransaction(txn_id, check_by, check_times, record, omitted)


def encode_reply(states: dict[str, LocalTransactionState]) -> dict[str, Any]:
    return {"states": {t: s.value for t, s in states.items()}}


def states_in(reply: bytes, txn_ids: Sequence[str]) -> dict[str, LocalTransactionState]:
    """The state of each of ``txn_ids`` in a check endpoint's reply.

    Raises:
        ValueError: the reply is not ``{"states": {txn_id: state}}`` naming every one asked, with
            a state of :class:`LocalTransactionState`; the message quotes the reply's start.
    """
    start = reply[:120]
    try:
        document = orjson.loads(reply)
    except ValueError as err:  # JSONDecodeError is a ValueError
        raise ValueError(f"the reply is not JSON ({err}): {start!r}") from err
    states = document.get("states") if isinstance(document, dict) else None
    if not isinstance(states, dict):
        raise ValueError(f'the reply has no "states" object: {start!r}')
    missing = [t for t in txn_ids if t not in states]
    if missing:
        raise ValueError(
            f"the reply names {len(txn_ids) - len(missing)} of the {len(txn_ids)} transactions "
            f"asked about; {missing[0]} is missing: {start!r}"
        )
    answer = {}
    for txn_id in txn_ids:
        try:
            answer[txn_id] = LocalTransactionState(states[txn_id])
        except ValueError:  # the enum's own refusal, whatever the value's type
            known = ", ".join(LocalTransactionState)
            raise ValueError(
                f"the reply gives {txn_id} the state {states[txn_id]!r}, not one of {known}"
            ) from None
    return answer


def endpoint_time(reply: bytes) -> float | None:
    """The endpoint's clock from a refusal of a stale request, if it told it."""
    try:
        document = orjson.loads(reply)
    except ValueError:
        return None
    value = document.get("time") if isinstance(document, dict) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _bytes(value: object, where: str) -> bytes | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ProtocolError(f"{where} must be base64 text or null")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as err:
        raise ProtocolError(f"{where} is not base64: {err}") from err


def _str(document: dict[str, Any], name: str, where: str) -> str:
    value = document.get(name)
    if not isinstance(value, str) or not value:
        raise ProtocolError(f"{where}.{name} must be a non-empty string")
    return value


def _optional_str(document: dict[str, Any], name: str) -> str | None:
    value = document.get(name)
    if value is not None and not isinstance(value, str):
        raise ProtocolError(f"{name} must be a string")
    return value


def _int(document: dict[str, Any], name: str, where: str, *, default: int | None = None) -> int:
    value = document.get(name, default)
    if type(value) is not int or value < 0:
        raise ProtocolError(f"{where}.{name} must be a non-negative integer, not {quoted(value)}")
    return value

"""Logging for the library and the services: plain text for people, one JSON object per line for
log pipelines (``log_format=json``).

A log line about a transaction or a record carries where it is as fields of its own, not only
in the message text, so a log pipeline can find every line of one transaction, partition or
offset without parsing prose: the call passes ``extra=fields(txn_id=..., partition=...,
offset=...)``, and :class:`JsonFormatter` writes each such field as a top-level key. The field
names are defined here once (:data:`TXN_ID` and the others), the same in the producer library,
the relay and the checker.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from typing import Any

#: The transaction id (a UUIDv7 string).
TXN_ID = "txn_id"
#: The producer group the transaction belongs to.
GROUP = "group"
#: The topic the partition and offsets are in (an internal topic unless said otherwise).
TOPIC = "topic"
#: A partition number (a transaction's half records share one; its op is on the same number).
PARTITION = "partition"
#: One record's offset.
OFFSET = "offset"
#: Several records' offsets (a transaction's half records), as a JSON array.
OFFSETS = "offsets"

#: LogRecord attributes that are not ``extra=`` fields.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def fields(
    *,
    txn_id: str | None = None,
    group: str | None = None,
    topic: str | None = None,
    partition: int | None = None,
    offset: int | None = None,
    offsets: Iterable[int] | None = None,
) -> dict[str, object]:
    """The ``extra=`` of a log call about a transaction or a record: the fields given (None
    leaves a field out), under the names every module uses."""
    given: dict[str, object] = {
        TXN_ID: txn_id,
        GROUP: group,
        TOPIC: topic,
        PARTITION: partition,
        OFFSET: offset,
        OFFSETS: None if offsets is None else list(offsets),
    }
    return {name: value for name, value in given.items() if value is not None}


class JsonFormatter(logging.Formatter):
    """``{"ts": ..., "level": ..., "logger": ..., "msg": ..., **extra}`` per record: every
    ``extra=`` field is a top-level key, numbers and lists of them kept as JSON numbers and
    arrays (anything else as its text)."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                document[key] = _json_value(value)
        if record.exc_info:
            document["exc"] = self.formatException(record.exc_info)
        return json.dumps(document, separators=(",", ":"))


def _json_value(value: object) -> object:
    if value is None or isinstance(value, int | float | bool | str):
        return value
    if isinstance(value, list | tuple) and all(
        isinstance(v, int | float | bool | str) for v in value
    ):
        return list(value)
    return str(value)


def configure_logging(log_format: str = "text", level: int = logging.INFO) -> None:
    """Root logging for a service process, in ``text`` or ``json``."""
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)

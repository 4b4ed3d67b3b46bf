"""Structured logs for the services."""

from __future__ import annotations

import io
import json
import logging

from outbox.logs import JsonFormatter, fields


def test_json_lines_carry_level_logger_message_and_extra_fields() -> None:
    record = logging.LogRecord("relay", logging.WARNING, __file__, 1, "parked %s", ("t1",), None)
    record.partition = 3
    line = json.loads(JsonFormatter().format(record))
    assert line["level"] == "WARNING" and line["logger"] == "relay"
    assert line["msg"] == "parked t1" and line["partition"] == 3
    assert line["ts"].endswith("Z")


def test_an_exception_is_kept_in_one_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record = logging.LogRecord(
            "relay", logging.ERROR, __file__, 1, "failed", (), sys.exc_info()
        )
    text = JsonFormatter().format(record)
    assert "\n" not in text and "ValueError: boom" in json.loads(text)["exc"]


def test_fields_become_top_level_keys_with_offsets_as_a_json_array() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("outbox.test-fields")
    logger.addHandler(handler)
    try:
        extra = fields(txn_id="t1", group=None, partition=2, offsets=(5, 7))
        logger.warning("op for %s not written", "t1", extra=extra)
    finally:
        logger.removeHandler(handler)
    line = json.loads(stream.getvalue())
    assert {k: line[k] for k in ("txn_id", "partition", "offsets")} == {
        "txn_id": "t1",
        "partition": 2,
        "offsets": [5, 7],
    }
    assert "group" not in line  # a field not given is left out, not written as null

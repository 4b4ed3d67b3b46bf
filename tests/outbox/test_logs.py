"""Structured logs for the services."""

from __future__ import annotations

import json
import logging

from outbox.logs import JsonFormatter


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

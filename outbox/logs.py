"""Logging set-up for the services: plain text for people, one JSON object per line for log
pipelines (``log_format=json``)."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

#: LogRecord attributes that are not ``extra=`` fields.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """``{"ts": ..., "level": ..., "logger": ..., "msg": ..., **extra}`` per record."""

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
                document[key] = value if isinstance(value, (int, float, bool, str)) else str(value)
        if record.exc_info:
            document["exc"] = self.formatException(record.exc_info)
        return json.dumps(document, separators=(",", ":"))


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

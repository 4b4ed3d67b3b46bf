"""Building a settings dataclass from environment variables with one prefix.

``{PREFIX}{FIELD}`` sets a field (converted to the field's type); ``{PREFIX}KAFKA__{KEY}`` passes a
librdkafka setting through, ``_`` standing for ``.`` (librdkafka's names have dots, never
underscores: ``OUTBOX_RELAY_KAFKA__LINGER_MS=5`` -> ``linger.ms=5``). Keyword overrides win.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any, TypeVar

from outbox.errors import ConfigurationError

T = TypeVar("T")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def from_env(
    cls: type[T],
    prefix: str,
    env: Mapping[str, str] | None,
    overrides: Mapping[str, Any],
    *,
    required: Sequence[str],
    fallbacks: Mapping[str, str] | None = None,
) -> T:
    """``cls(**values)`` from ``env`` (default ``os.environ``).

    ``fallbacks`` names variables shared by several services (e.g. ``OUTBOX_BOOTSTRAP_SERVERS``)
    used when the prefixed one is absent.

    Raises:
        ConfigurationError: a value that does not convert, or a required setting missing; the
            message names the variable.
    """
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for name, variable in (fallbacks or {}).items():
        if variable in env:
            values[name] = env[variable]
    for f in fields(cls):  # type: ignore[arg-type]
        variable = prefix + f.name.upper()
        if f.name != "kafka" and variable in env:
            values[f.name] = _convert(variable, env[variable], f.type)
    kafka_prefix = prefix + "KAFKA__"
    kafka = {
        k[len(kafka_prefix) :].lower().replace("_", "."): v
        for k, v in env.items()
        if k.startswith(kafka_prefix)
    }
    if kafka:
        values["kafka"] = kafka
    values.update(overrides)
    missing = [prefix + n.upper() for n in required if n not in values]
    if missing:
        raise ConfigurationError(f"missing settings: set {', '.join(missing)}")
    return cls(**values)


def _convert(variable: str, raw: str, kind: object) -> Any:
    kind = str(kind).replace(" | None", "")
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
    except ValueError as err:
        raise ConfigurationError(f"{variable}={raw!r} is not a valid {kind}") from err
    if kind == "bool":
        lowered = raw.strip().lower()
        if lowered not in _TRUE + _FALSE:
            raise ConfigurationError(f"{variable}={raw!r} is not a boolean (true/false)")
        return lowered in _TRUE
    return raw

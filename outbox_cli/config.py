"""``kafka-outbox config``: the effective settings, as a TOML file would give them, secrets masked.

The output is itself a valid config file (sources as comments), so an operator can see at a
glance which value came from the file, which from the environment and which is a default.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import sys
from dataclasses import fields
from typing import Any

from outbox.env import KAFKA_FIELD
from outbox.errors import ConfigurationError
from outbox_cli.errors import UsageError
from outbox_cli.settings import SERVICES, Service, available, known_variables, unknown_variables

MASK = "***"
#: Setting names and librdkafka keys whose values are never printed.
SECRET_NAMES = re.compile(r"secret|password|passwd|jaas|token|credential|key\.pem|private", re.I)


def show(services: list[str], *, as_json: bool) -> int:
    """Print each chosen service's settings; 2 when any of them is invalid here."""
    invalid = 0
    documents: dict[str, Any] = {}
    for name in services:
        service = SERVICES[name]
        try:
            settings = service.load()
        except ConfigurationError as err:
            invalid += 1
            print(f"kafka-outbox: error: [{name}] {err}", file=sys.stderr)
            continue
        documents[name] = (settings, service.sources())
    for variable in unknown_variables(os.environ):
        print(
            f"kafka-outbox: warning: {variable} is not a setting{_hint(variable)}", file=sys.stderr
        )
    if as_json:
        print(json.dumps({n: masked(s) for n, (s, _) in documents.items()}, indent=2))
    else:
        for name, (settings, sources) in documents.items():
            print(render(SERVICES[name], settings, sources))
    if invalid:
        raise UsageError(f"{invalid} of {len(services)} settings objects are not valid here")
    return 0


def masked(settings: Any) -> dict[str, Any]:
    """The settings as a dict, secret values replaced by ``***``."""
    out: dict[str, Any] = {}
    for f in fields(settings):
        value = getattr(settings, f.name)
        if f.name == KAFKA_FIELD:
            out[f.name] = {k: _mask(k, v) for k, v in dict(value).items()}
        else:
            out[f.name] = _mask(f.name, value)
    return out


#: The password of a URL (``postgresql://user:password@host/db``, ``...?password=...``).
URL_PASSWORD = re.compile(r"(://[^:/@]*:)[^@]*@")
QUERY_PASSWORD = re.compile(r"([?&;](?:password|passwd|pwd)=)[^&;]*", re.I)


def _mask(name: str, value: Any) -> Any:
    if value not in (None, "") and SECRET_NAMES.search(name):
        return MASK
    if isinstance(value, str) and "://" in value:
        return QUERY_PASSWORD.sub(rf"\g<1>{MASK}", URL_PASSWORD.sub(rf"\g<1>{MASK}@", value))
    return value


def render(service: Service, settings: Any, sources: dict[str, str]) -> str:
    values = masked(settings)
    lines = [f"# {service.name}: {service.prefix}* variables, or [{service.name}] in a config file"]
    lines.append(f"[{service.name}]")
    for name, value in values.items():
        if name == KAFKA_FIELD:
            continue
        line = f"# {name} = (not set)" if value is None else f"{name} = {_toml(value)}"
        lines.append(f"{line:<44}  # {sources.get(name, 'default')}")
    kafka = values.get(KAFKA_FIELD) or {}
    if kafka:
        lines.append(f"[{service.name}.kafka]  # {sources.get(KAFKA_FIELD, 'default')}")
        lines += [f"{json.dumps(k)} = {_toml(v)}" for k, v in sorted(kafka.items())]
    return "\n".join(lines) + "\n"


def _toml(value: Any) -> str:
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value))


def _hint(variable: str) -> str:
    """A close name of the same service (its prefix is the longest one that matches)."""
    names, _ = known_variables()
    prefixes = sorted((s.prefix for s in available()), key=len, reverse=True)
    prefix = next(p for p in prefixes if variable.startswith(p))
    close = difflib.get_close_matches(variable, sorted(n for n in names if n.startswith(prefix)), 1)
    return f" (did you mean {close[0]}?)" if close else ""

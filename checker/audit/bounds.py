"""``--from`` / ``--to`` / ``--as-of`` values and durations, parsed without Spark.

A bound is one of:

- ``earliest`` / ``latest``: the start or the end of what the topics hold;
- a time: ISO-8601 (``2026-11-22T10:00:00Z``; without a zone it is UTC), Unix milliseconds
  (``1795000000000``), ``now``, or ``now-2h`` / ``now+5m`` (a duration, below);
- offsets: Spark's JSON, ``{"__outbox-half": {"0": 120, "1": 4000}}``, per topic and partition
  (-2 = earliest, -1 = latest); partitions not named take earliest (``--from``) or latest
  (``--to``).

Times and offsets are not mixed in one audit (``earliest``/``latest`` go with either).
Durations: ``90`` (seconds), ``500ms``, ``90s``, ``5m``, ``2h``, ``7d``.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from checker.audit.errors import AuditConfigError


@dataclass(frozen=True)
class Earliest:
    """The start of what the topics hold."""


@dataclass(frozen=True)
class Latest:
    """The end of what the topics hold when the audit reads them."""


@dataclass(frozen=True)
class AtTime:
    """A broker timestamp, Unix ms (the half and op topics use LogAppendTime)."""

    ms: int


@dataclass(frozen=True)
class AtOffsets:
    """Offsets per topic and partition, as Spark's ``startingOffsets`` JSON writes them."""

    offsets: Mapping[str, Mapping[int, int]] = field(default_factory=dict)


Bound = Earliest | Latest | AtTime | AtOffsets

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_NOW = re.compile(r"^now\s*(?:([+-])\s*(.+))?$")


def parse_duration_ms(text: str, *, what: str = "duration") -> int:
    """``90`` / ``90s`` / ``500ms`` / ``5m`` / ``2h`` / ``7d`` as milliseconds.

    Raises:
        AuditConfigError: not a duration.
    """
    match = _DURATION.match(text)
    if match is None:
        raise AuditConfigError(
            f"{what} {text!r} is not a duration; write e.g. 90s, 500ms, 5m, 2h or 7d"
        )
    number, unit = match.groups()
    return round(float(number) * _UNITS_MS[unit or "s"])


def parse_time_ms(text: str, *, now_ms: int, what: str = "time") -> int:
    """An ISO-8601 date-time, Unix ms, ``now`` or ``now±duration`` as Unix ms.

    Raises:
        AuditConfigError: none of those.
    """
    value = text.strip()
    now = _NOW.match(value)
    if now is not None:
        sign, amount = now.groups()
        if sign is None:
            return now_ms
        delta = parse_duration_ms(amount, what=f"{what} {text!r}:")
        return now_ms + delta if sign == "+" else now_ms - delta
    if value.isdigit():
        return int(value)
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError as err:
        raise AuditConfigError(
            f"{what} {text!r} is not a time; write an ISO-8601 date-time "
            "(2026-11-22T10:00:00Z), Unix milliseconds, now or now-2h"
        ) from err
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return int(parsed.timestamp() * 1000)


def parse_bound(text: str, *, now_ms: int, what: str) -> Bound:
    """One ``--from`` / ``--to`` value (module docstring).

    Raises:
        AuditConfigError: not a bound; the message shows the accepted forms.
    """
    value = text.strip()
    if value == "earliest":
        return Earliest()
    if value == "latest":
        return Latest()
    if value.startswith("{"):
        return AtOffsets(_parse_offsets(value, what))
    return AtTime(parse_time_ms(value, now_ms=now_ms, what=what))


def _parse_offsets(text: str, what: str) -> dict[str, dict[int, int]]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as err:
        raise AuditConfigError(f"{what} is not valid JSON offsets: {err}") from err
    problem = (
        f'{what} must look like {{"topic": {{"0": 120, "1": -2}}}} '
        "(offsets per partition; -2 earliest, -1 latest)"
    )
    if not isinstance(document, dict):
        raise AuditConfigError(problem)
    offsets: dict[str, dict[int, int]] = {}
    for topic, partitions in document.items():
        if not isinstance(partitions, dict):
            raise AuditConfigError(problem)
        try:
            offsets[topic] = {int(p): int(o) for p, o in partitions.items()}
        except (TypeError, ValueError) as err:
            raise AuditConfigError(f"{problem}: {err}") from err
        if any(o < -2 for o in offsets[topic].values()):
            raise AuditConfigError(f"{problem}: offsets below -2 in {topic!r}")
    return offsets


def check_pair(start: Bound, end: Bound) -> None:
    """Refuse a ``--from`` / ``--to`` pair that cannot describe one range.

    Raises:
        AuditConfigError: from=latest or to=earliest, times mixed with offsets, or an empty
            time range.
    """
    if isinstance(start, Latest):
        raise AuditConfigError("--from latest leaves nothing to audit; use earliest or a time")
    if isinstance(end, Earliest):
        raise AuditConfigError("--to earliest leaves nothing to audit; use latest or a time")
    kinds = {type(b) for b in (start, end)} - {Earliest, Latest}
    if len(kinds) > 1:
        raise AuditConfigError(
            "--from and --to mix a time with offsets; give both as times or both as offsets"
        )
    if isinstance(start, AtTime) and isinstance(end, AtTime) and start.ms >= end.ms:
        raise AuditConfigError(f"--from ({start.ms}) must be before --to ({end.ms})")


def describe(bound: Bound) -> str | int | dict[str, dict[str, int]]:
    """A JSON-friendly form of a bound, for the summary."""
    if isinstance(bound, Earliest):
        return "earliest"
    if isinstance(bound, Latest):
        return "latest"
    if isinstance(bound, AtTime):
        return bound.ms
    return {t: {str(p): o for p, o in ps.items()} for t, ps in bound.offsets.items()}

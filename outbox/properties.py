"""Kafka client settings from a properties file, the ``--command-config`` of Kafka's own tools.

The file is read as Java reads ``.properties`` (what Kafka's tools are given): ``key=value``,
``key: value`` or ``key value``; ``#`` and ``!`` start a comment line; a line ending in a
backslash goes on on the next one (a multi-line ``sasl.jaas.config``); ``\\t``, ``\\n``,
``\\uXXXX`` and ``\\`` before any other character are escapes (``C:\\\\certs`` is ``C:\\certs``);
leading whitespace of a value is dropped, trailing whitespace kept; a UTF-8 byte-order mark is
skipped. Keys are the client's own: librdkafka's (``security.protocol``, ``sasl.username``,
``ssl.ca.location``) for the producers, relay, checker and operator commands; the Java client's
(``sasl.jaas.config``) for the Spark audit, whose Kafka source is Java. A key the client does not
know is refused by it, naming the key.
"""

from __future__ import annotations

from pathlib import Path

from outbox.errors import ConfigurationError

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_SEPARATORS = "=: \t\f"


def load_properties(path: str | Path) -> dict[str, str]:
    """The settings in the properties file at ``path``.

    Raises:
        ConfigurationError: the file cannot be read, or a line cannot be parsed.
    """
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) else "not UTF-8 text"
        raise ConfigurationError(
            f"--command-config {str(path)!r} cannot be read ({reason}); give a Kafka client "
            "properties file (key=value lines)"
        ) from err
    found: dict[str, str] = {}
    for number, line in _logical_lines(text):
        key, value = _split(line)
        try:
            found[_unescape(key)] = _unescape(value)
        except ValueError as err:
            raise ConfigurationError(f"{path}:{number}: {err}") from err
    return found


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each logical line, continuations joined, comments out."""
    lines: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.lstrip(" \t\f")
        if pending is None and (not stripped or stripped[0] in "#!"):
            continue
        start, so_far = pending if pending is not None else (number, "")
        so_far += stripped
        trailing = len(so_far) - len(so_far.rstrip("\\"))
        if trailing % 2:  # an odd number of backslashes: the last one continues the line
            pending = (start, so_far[:-1])
            continue
        pending = None
        lines.append((start, so_far))
    if pending is not None:
        lines.append(pending)
    return lines


def _split(line: str) -> tuple[str, str]:
    """Key and value: the key ends at the first unescaped separator."""
    i = 0
    while i < len(line) and line[i] not in _SEPARATORS:
        i += 2 if line[i] == "\\" else 1
    key, rest = line[:i], line[i:]
    rest = rest.lstrip(" \t\f")
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t\f")
    return key, rest


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char != "\\" or i + 1 == len(text):
            out.append(char)
            i += 1
            continue
        escaped = text[i + 1]
        if escaped == "u":
            digits = text[i + 2 : i + 6]
            if len(digits) != 4 or any(c not in "0123456789abcdefABCDEF" for c in digits):
                raise ValueError(f"malformed \\u escape {text[i : i + 6]!r}")
            out.append(chr(int(digits, 16)))
            i += 6
            continue
        out.append(_ESCAPES.get(escaped, escaped))
        i += 2
    return "".join(out)

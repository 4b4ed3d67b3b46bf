"""librdkafka settings from a properties file, the ``--command-config`` of Kafka's own tools.

One ``key=value`` per line (``key: value`` and ``key value`` too), ``#`` and ``!`` start a
comment line, blank lines are skipped; keys are librdkafka's (``security.protocol``,
``sasl.mechanism``, ``sasl.username``, ``ssl.ca.location``...). Java-only keys such as
``sasl.jaas.config`` have no librdkafka meaning and are refused by the client that gets them,
naming the key. Line continuations and escapes of the Java format are not needed by any
librdkafka value and are not supported: a line ending in ``\\`` is refused rather than misread.
"""

from __future__ import annotations

import re
from pathlib import Path

from outbox.errors import ConfigurationError

_SEPARATOR = re.compile(r"\s*[=:]\s*|\s+")


def load_properties(path: str | Path) -> dict[str, str]:
    """The settings in the properties file at ``path``.

    Raises:
        ConfigurationError: the file cannot be read, or a line is not ``key=value``.
    """
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ConfigurationError(
            f"--command-config {str(path)!r} cannot be read ({err.strerror}); give a "
            "librdkafka properties file (key=value lines)"
        ) from err
    found: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        if line.endswith("\\"):
            raise ConfigurationError(
                f"{path}:{number}: continued lines are not supported; write {line[:30]!r} "
                "on one line"
            )
        parts = _SEPARATOR.split(line, maxsplit=1)
        if len(parts) != 2 or not parts[0]:
            raise ConfigurationError(f"{path}:{number}: {line[:60]!r} is not key=value")
        found[parts[0]] = parts[1]
    return found

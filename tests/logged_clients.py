"""The suite's own Kafka clients log through Python logging, as the library's do.

Tests build consumers, producers and admin clients of their own (to read a real topic, to seed
records, to break things). Left alone, librdkafka writes their log to stderr from its threads,
past pytest's capture: a test that stops a broker leaves its clients printing
``%3|...|FAIL|... Connection refused`` into the run's output long after, and a reader takes the
"FAIL" for the result. Imported by ``tests/conftest.py`` before any test module, this makes
``confluent_kafka.Consumer`` and ``Producer`` the same classes with
:func:`outbox.kafka_logging.log_to_python` applied to their settings; pytest then shows those
lines with a failing test's log, like any other. Code in child processes is the library's, which
does this itself. (``admin.AdminClient`` is left alone: its ``__init__`` looks its own class up
by module name, so a replaced name breaks the library's admin clients; the tests' are
short-lived.)
"""

from __future__ import annotations

from typing import Any

import confluent_kafka

from outbox.kafka_logging import log_to_python


def _logged(cls: type[Any]) -> type[Any]:
    def __init__(self: Any, config: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        cls.__init__(self, log_to_python(config), *args, **kwargs)

    return type(cls.__name__, (cls,), {"__init__": __init__, "__module__": cls.__module__})


def install() -> None:
    """Replace the two client classes for everything imported from now on (idempotent)."""
    if getattr(confluent_kafka.Consumer, "_outbox_logged", False):
        return
    for name in ("Consumer", "Producer"):
        logged = _logged(getattr(confluent_kafka, name))
        logged._outbox_logged = True  # type: ignore[attr-defined]
        setattr(confluent_kafka, name, logged)

"""librdkafka's own log lines through Python logging, for every Kafka client this project makes.

Left alone, librdkafka writes its log to stderr from its own threads
(``%3|1700000000.123|FAIL|rdkafka#producer-1| ... Connection refused``): past a service's log
format and level, and after a run's result when a client outlives its broker. Given a ``logger``
setting, confluent-kafka calls ``logger.log(level, "%s [%s] %s", facility, client, line)`` for
each line instead; :func:`log_to_python` adds one to a client's settings, which logs to
``outbox.librdkafka`` (:data:`LOGGER_NAME`): set that logger's level to silence or raise them.
A ``logger`` the user put in the ``kafka`` settings wins (with confluent-kafka's levels as is).

Levels (:data:`SYSLOG_LEVELS`): librdkafka logs at ERR what it retries by itself (a refused or
dropped connection, all brokers down); what does fail reaches the caller through the call (an
exception, a delivery report, a timeout), which this library reports at its own level. So ERR is
a WARNING here, as is librdkafka's WARNING (a setting it ignores, a session timed out); EMERG to
CRIT stay CRITICAL; NOTICE and INFO are INFO, and so is DEBUG, written only for the ``debug``
contexts a user asked for: they show where a service logs (INFO) without lowering its level.

Caveat: with a ``logger``, librdkafka queues its lines and confluent-kafka logs them from the
call that serves the client's queue, in the thread that called it: ``poll()`` and ``flush()`` of
a producer, ``poll()``, ``consume()`` and ``close()`` of a consumer, and only ``poll()`` of an
admin client (its other calls do not serve it). So a record's time is when it was served, not
when librdkafka wrote it, and a client never served again keeps its lines in memory until it is
destroyed, when they are dropped (one nobody serves any more says nothing, however long it
stays open). Nothing waits for a line. The library's producers are served by their poll threads
and flushes, its consumers by their reads, and its admin clients are polled (``poll(0)``) after
their calls.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

#: The logger librdkafka's lines go to.
LOGGER_NAME = "outbox.librdkafka"

#: librdkafka's syslog level (0 EMERG .. 7 DEBUG) -> the Python level its line is logged at.
SYSLOG_LEVELS = {
    0: logging.CRITICAL,
    1: logging.CRITICAL,
    2: logging.CRITICAL,
    3: logging.WARNING,
    4: logging.WARNING,
    5: logging.INFO,
    6: logging.INFO,
    7: logging.INFO,
}

#: confluent-kafka's own translation of the syslog levels: the level a ``logger`` is handed.
_CONFLUENT_LEVELS = {
    0: logging.CRITICAL,
    1: logging.CRITICAL,
    2: logging.CRITICAL,
    3: logging.ERROR,
    4: logging.WARNING,
    5: logging.INFO,
    6: logging.INFO,
    7: logging.DEBUG,
}

#: The level confluent-kafka hands over -> ours (the syslog levels it merges, we merge too).
_LEVELS = {_CONFLUENT_LEVELS[s]: SYSLOG_LEVELS[s] for s in SYSLOG_LEVELS}


class LibrdkafkaLogger:
    """The ``logger`` confluent-kafka is given: its ``log`` calls, at this module's levels, on a
    :class:`logging.Logger`."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger

    def log(self, level: int, msg: str, *args: object) -> None:
        self.logger.log(_LEVELS.get(level, level), msg, *args)


#: The one shared by every client (confluent-kafka keeps a reference per client).
_DEFAULT = LibrdkafkaLogger(logging.getLogger(LOGGER_NAME))


def log_to_python(config: Mapping[str, Any]) -> dict[str, Any]:
    """A client's settings with librdkafka's log sent to Python logging (see the module doc);
    a ``logger`` already in ``config`` (the user's) is kept."""
    return {"logger": _DEFAULT, **config}

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

Repeats (:class:`Repeats`): with its broker away a client logs its refused connection again
every 50 ms or so for as long as the broker stays away (librdkafka's exponential reconnect
backoff does not apply there: with no broker up, each metadata or coordinator query asks for a
connection at once, at most every ``reconnect.backoff.ms / 2``), and a client served late hands
them over in one burst: thousands of lines a minute per client. So a line that repeats one
logged in the last :data:`REPEAT_WINDOW_S` (same client, facility and level; the same text but
for its durations and librdkafka's own counts) is counted, not logged. The next one after the
window is logged with that count (``... (1234 like it in the 60 s before, not logged)``). A kind
that stopped repeating has its last held-back line logged with its count once any line arrives a
window later (librdkafka says something on most changes); if none ever does, that count is not
logged. DEBUG lines (the ``debug`` contexts a user asked for) are all logged.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
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


#: A line like one logged less than this many seconds ago is counted, not logged.
REPEAT_WINDOW_S = 60.0

#: What varies between two lines of one kind: a duration (``after 0ms in state CONNECT``) and
#: librdkafka's own count (``3 identical error(s) suppressed``).
_VARYING = re.compile(r"\d+(?=ms\b)|\d+(?= identical error)")

#: A kind of line: level, facility, client, and its text without what varies.
_Kind = tuple[int, object, object, str]

#: A line to log: its level, its arguments (facility, client, text), how many lines like it were
#: not logged and over how many seconds.
Line = tuple[int, tuple[object, ...], int, float]


class _Seen:
    """One kind's last logged line and what was held back since."""

    __slots__ = ("at", "held", "last", "last_at")

    def __init__(self, at: float, last: tuple[object, ...]) -> None:
        self.at, self.held, self.last, self.last_at = at, 0, last, at


class Repeats:
    """Which kinds of line were logged in the last ``window_s`` and how many like each were held
    back since (see the module doc). Bounded: a kind is forgotten one window after its last
    logged line (its count logged then, if it has one), so it keeps at most one entry per kind
    the clients logged in the last two windows."""

    def __init__(
        self, window_s: float = REPEAT_WINDOW_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.window_s = window_s
        self._clock = clock
        self._seen: dict[_Kind, _Seen] = {}
        self._swept = clock()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """How many kinds of line it keeps."""
        return len(self._seen)

    def admit(self, level: int, args: tuple[object, ...]) -> list[Line]:
        """What to log for this line (``args``: facility, client, text): itself unless one like
        it was logged less than a window ago, and the counts of the kinds that stopped."""
        facility, client, text = args
        kind = (level, facility, client, _VARYING.sub("#", str(text)))
        now = self._clock()
        with self._lock:
            lines = self._sweep(now, kind) if now - self._swept >= self.window_s else []
            seen = self._seen.get(kind)
            if seen is None:
                self._seen[kind] = _Seen(now, args)
                lines.append((level, args, 0, 0.0))
            elif now - seen.at < self.window_s:
                seen.held += 1
                seen.last, seen.last_at = args, now
            else:
                lines.append((level, args, seen.held, now - seen.at))
                seen.at, seen.held, seen.last, seen.last_at = now, 0, args, now
        return lines

    def _sweep(self, now: float, arriving: _Kind) -> list[Line]:
        """Forget the kinds not logged for a window but the ``arriving`` one (logged with its
        count now); the last of each one's held-back lines, with the count of those before it
        since its last logged line."""
        self._swept = now
        gone = [
            kind
            for kind, seen in self._seen.items()
            if now - seen.at >= self.window_s and kind != arriving
        ]
        lines: list[Line] = []
        for kind in gone:
            seen = self._seen.pop(kind)
            if seen.held:
                lines.append((kind[0], seen.last, seen.held - 1, seen.last_at - seen.at))
        return lines


class LibrdkafkaLogger:
    """The ``logger`` confluent-kafka is given: its ``log`` calls, at this module's levels and
    with repeats counted rather than logged (:class:`Repeats`), on a :class:`logging.Logger`."""

    def __init__(self, logger: logging.Logger, repeats: Repeats | None = None) -> None:
        self.logger = logger
        self.repeats = Repeats() if repeats is None else repeats

    def log(self, level: int, msg: str, *args: object) -> None:
        ours = _LEVELS.get(level, level)
        if level <= logging.DEBUG or len(args) != 3 or msg != _FORMAT:
            self.logger.log(ours, msg, *args)
            return
        for line_level, line, held, over_s in self.repeats.admit(ours, args):
            if held:
                self.logger.log(line_level, _FORMAT + _HELD, *line, held, over_s)
            else:
                self.logger.log(line_level, _FORMAT, *line)


#: How confluent-kafka hands a line over: facility, client name, text.
_FORMAT = "%s [%s] %s"
#: What a line logged after a window says of the lines like it that were not.
_HELD = " (%d like it in the %.0f s before, not logged)"


#: The one shared by every client (confluent-kafka keeps a reference per client).
_DEFAULT = LibrdkafkaLogger(logging.getLogger(LOGGER_NAME))


def log_to_python(config: Mapping[str, Any]) -> dict[str, Any]:
    """A client's settings with librdkafka's log sent to Python logging (see the module doc);
    a ``logger`` already in ``config`` (the user's) is kept."""
    return {"logger": _DEFAULT, **config}

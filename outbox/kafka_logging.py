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

Repeats (:mod:`outbox.log_repeats`): with its broker away a client retries its connection
every 50 ms or so for as long as the broker stays away, logging each refusal (librdkafka's
growing reconnect backoff does not show there: with no broker up, each metadata or coordinator
query asks for a connection at once, at most every ``reconnect.backoff.ms / 2``), and a client
served late hands its queued lines over in one burst: thousands of lines a minute per client.
So a line like one logged in the last :data:`REPEAT_WINDOW_S` (same client, facility and level;
the same text but for its durations and librdkafka's own ``N identical error(s)`` count) is
counted, not logged. The next one after the window is logged with that count
(``... (1199 like it in the 60.0 s before, not logged)``). A kind that stopped repeating has its
count logged a window or two after its last line, by a timer, with that line and how long ago
it came (``... (held back: 37 like it in the 2.0 s after the one logged; the last 61.3 s
ago)``). At a normal exit every count the library's clients still hold is logged
(:func:`flush_held`); an ``os._exit`` (the watchdog's stuck exit) loses them. CRITICAL lines
(librdkafka's EMERG to CRIT) and DEBUG lines (the ``debug`` contexts a user asked for) are all
logged; a line the logger would not log is not counted either.
"""

from __future__ import annotations

import atexit
import logging
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

from outbox.log_repeats import REPEAT_WINDOW_S, Logged, Repeats, log_lines, renew_after_fork

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


#: What varies between two lines of one kind: a duration (``after 0ms in state CONNECT``) and
#: librdkafka's own count (``3 identical error(s) suppressed``).
_VARYING = re.compile(r"\d+(?=ms\b)|\d+(?= identical error)")

#: How confluent-kafka hands a line over: facility, client name, text.
_FORMAT = "%s [%s] %s"

__all__ = [
    "LOGGER_NAME",
    "REPEAT_WINDOW_S",
    "SYSLOG_LEVELS",
    "LibrdkafkaLogger",
    "flush_held",
    "log_to_python",
]


class LibrdkafkaLogger:
    """The ``logger`` confluent-kafka is given: its ``log`` calls, at this module's levels and
    with repeats counted rather than logged (:class:`~outbox.log_repeats.Repeats`), on a
    :class:`logging.Logger`."""

    def __init__(
        self,
        logger: logging.Logger,
        repeats: Repeats | None = None,
        schedule: Callable[[float, Callable[[], None]], object] | None = None,
    ) -> None:
        """``schedule(delay_s, call)`` runs ``call`` once, ``delay_s`` from now (by default on a
        daemon :class:`threading.Timer`): the sweep that logs a stopped kind's count."""
        self.logger = logger
        self.repeats = Repeats() if repeats is None else repeats
        self._schedule = _on_a_timer if schedule is None else schedule
        self._timer_lock = threading.Lock()
        #: Whether a sweep is scheduled.
        self._armed = False
        renew_after_fork(self)

    def after_fork(self) -> None:
        """In a forked child (whose :class:`Repeats` starts empty): no timer, a new lock."""
        self._timer_lock = threading.Lock()
        self._armed = False

    def log(self, level: int, msg: str, *args: object) -> None:
        """One of librdkafka's lines (confluent-kafka hands it over as ``"%s [%s] %s"``,
        facility, client, text). CRITICAL and DEBUG lines, and any of another shape, are logged
        as they come: they are rare or were asked for. An error here would come out of the
        client's ``poll()``, so counting that fails logs the line as it came."""
        ours = _LEVELS.get(level, level)
        if level <= logging.DEBUG or ours >= logging.CRITICAL or len(args) != 3 or msg != _FORMAT:
            self.logger.log(ours, msg, *args)
            return
        if not self.logger.isEnabledFor(ours):
            return  # neither logged nor worth counting
        try:
            facility, client, text = args
            kind = (ours, facility, client, _VARYING.sub("#", str(text)))
            lines, counted = self.repeats.admit(kind, ours, args)
        except Exception:  # never lose the line to the counting
            self.logger.log(ours, msg, *args)
            return
        self._emit(lines)
        if counted:
            self._arm()

    def flush(self, *, everything: bool = False) -> None:
        """Log the counts of the kinds that stopped repeating (every count held, with
        ``everything``: at exit). A timer calls it a window after a line was counted."""
        self._emit(self.repeats.sweep(everything=everything))

    def _emit(self, lines: list[Logged]) -> None:
        # Logged outside the counting's lock (a handler may be slow, or log itself), so two
        # threads' lines of one kind can come out in either order; the counts stay right.
        log_lines(self.logger, _FORMAT, lines)

    def _arm(self) -> None:
        """A sweep one window from now, so that a count is logged though no line follows it.
        If none can be scheduled (no thread to be had), the next counted line tries again and
        the exit's flush logs what is held."""
        with self._timer_lock:
            if self._armed:
                return
            self._armed = True
        try:
            self._schedule(self.repeats.window_s, self._tick)
        except BaseException as err:  # an interrupt too: else no sweep is ever asked for again
            with self._timer_lock:
                self._armed = False
            if not isinstance(err, Exception):
                raise

    def _tick(self) -> None:
        with self._timer_lock:
            self._armed = False
        self.flush()
        if self.repeats.holding():
            self._arm()


def _on_a_timer(delay_s: float, call: Callable[[], None]) -> None:
    timer = threading.Timer(delay_s, call)
    timer.name = "outbox-librdkafka-repeats"
    timer.daemon = True
    timer.start()


#: The one shared by every client (confluent-kafka keeps a reference per client).
_DEFAULT = LibrdkafkaLogger(logging.getLogger(LOGGER_NAME))


def flush_held() -> None:
    """Log every count the library's clients' lines still hold: at a normal exit (registered
    here, so it runs before logging's own shutdown), or where a caller wants them now (a test
    suite, after each test)."""
    _DEFAULT.flush(everything=True)


atexit.register(flush_held)


def log_to_python(config: Mapping[str, Any]) -> dict[str, Any]:
    """A client's settings with librdkafka's log sent to Python logging (see the module doc);
    a ``logger`` already in ``config`` (the user's) is kept."""
    return {"logger": _DEFAULT, **config}

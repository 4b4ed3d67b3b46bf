"""Repeated log lines counted rather than logged: what keeps a broker outage from flooding a log.

A line is of a *kind* (the caller says which: for librdkafka's, its level, facility, client and
text without what varies, :mod:`outbox.kafka_logging`). The first line of a kind is logged; one
like it within ``window_s`` of the last one logged is counted instead; the first one after the
window is logged with that count. A kind not seen for a window has *stopped*: :meth:`Repeats.sweep`
forgets it and hands back its count, with its last line and how long ago that came, if it held
any back. So every line is either logged or counted in a line that is, unless the process ends
first (the caller sweeps at exit).

Bounded: a kind is forgotten by the first sweep a window after it was last seen, and
:meth:`Repeats.admit` sweeps when a window has passed since the last sweep, so what is kept is
at most the kinds seen within two windows before the latest line (each logged its first line).

In a forked child a :class:`Repeats` starts empty with a new lock: the parent's clients are not
the child's, and a lock another thread of the parent held at the fork would stay held there.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Protocol

#: A line like one logged less than this many seconds ago is counted, not logged.
REPEAT_WINDOW_S = 60.0
#: What a line logged a window after the last like it says of those between.
HELD = " (%d like it in the %.1f s before, not logged)"
#: What a stopped kind's count says: how many, over how long, and when the last (shown) came.
STOPPED = " (held back: %d like it in the %.1f s after the one logged; the last %.1f s ago)"


@dataclass(frozen=True)
class Logged:
    """A line to log now."""

    level: int
    #: The line's arguments, as the caller gave them.
    args: tuple[object, ...]
    #: How many lines like it were counted, not logged...
    held: int = 0
    #: ...over how many seconds after the last one logged.
    over_s: float = 0.0
    #: None for a line logged as it came; for a stopped kind's count, the seconds since its
    #: last line (``args``, one of those counted) came.
    ago_s: float | None = None


class _Seen:
    """One kind's last logged line and what was counted since."""

    __slots__ = ("at", "held", "last", "last_at", "level")

    def __init__(self, level: int, at: float, last: tuple[object, ...]) -> None:
        self.level, self.at, self.held, self.last, self.last_at = level, at, 0, last, at


class Repeats:
    """Which kinds of line were logged in the last ``window_s`` and how many like each were
    counted since (see the module doc). Thread-safe."""

    def __init__(
        self, window_s: float = REPEAT_WINDOW_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.window_s = window_s
        self._clock = clock
        self._seen: dict[Hashable, _Seen] = {}
        self._swept = clock()
        self._lock = threading.Lock()
        renew_after_fork(self)

    def after_fork(self) -> None:
        """In a forked child: empty, with a new lock (see the module doc)."""
        self._lock = threading.Lock()
        self._seen = {}

    def __len__(self) -> int:
        """How many kinds of line it keeps."""
        return len(self._seen)

    def holding(self) -> bool:
        """Whether any kind has lines counted and not yet logged."""
        with self._lock:
            return any(seen.held for seen in self._seen.values())

    def admit(
        self, kind: Hashable, level: int, args: tuple[object, ...]
    ) -> tuple[list[Logged], bool]:
        """What to log now that a line of ``kind`` came: itself unless one like it was logged
        less than a window ago (with the count of those between if any), and the counts of the
        kinds that stopped if a window passed since the last sweep; and whether this line was
        counted instead of logged."""
        now = self._clock()
        with self._lock:
            lines = self._sweep(now, everything=False) if now - self._swept >= self.window_s else []
            seen = self._seen.get(kind)
            if seen is None:
                self._seen[kind] = _Seen(level, now, args)
                lines.append(Logged(level, args))
            elif now - seen.at < self.window_s:
                seen.held += 1
                seen.last, seen.last_at = args, now
                return lines, True
            else:
                lines.append(Logged(level, args, seen.held, now - seen.at))
                seen.at, seen.held, seen.last, seen.last_at = now, 0, args, now
        return lines, False

    def sweep(self, *, everything: bool = False) -> list[Logged]:
        """Forget the kinds not seen for a window (every kind, with ``everything``: at exit);
        the counts of those that held lines back, each with its last line."""
        now = self._clock()
        with self._lock:
            return self._sweep(now, everything=everything)

    def _sweep(self, now: float, *, everything: bool) -> list[Logged]:
        self._swept = now
        gone = [
            kind
            for kind, seen in self._seen.items()
            if everything or now - seen.last_at >= self.window_s
        ]
        lines = []
        for kind in gone:
            seen = self._seen.pop(kind)
            if seen.held:
                over_s, ago_s = seen.last_at - seen.at, now - seen.last_at
                lines.append(Logged(seen.level, seen.last, seen.held, over_s, ago_s))
        return lines


def log_lines(logger: logging.Logger, form: str, lines: Iterable[Logged]) -> None:
    """Log each of ``lines`` (from :meth:`Repeats.admit` or :meth:`Repeats.sweep`) at its
    level: its arguments with ``form``, and what was counted in its place (:data:`HELD`,
    :data:`STOPPED`)."""
    for line in lines:
        if line.ago_s is not None:
            extra: tuple[object, ...] = (line.held, line.over_s, line.ago_s)
            logger.log(line.level, form + STOPPED, *line.args, *extra)
        elif line.held:
            logger.log(line.level, form + HELD, *line.args, line.held, line.over_s)
        else:
            logger.log(line.level, form, *line.args)


class ForkAware(Protocol):
    def after_fork(self) -> None:
        """Called in a forked child, before anything else runs there."""


#: What :func:`renew_after_fork` was given, held weakly.
_RENEWED: weakref.WeakSet[ForkAware] = weakref.WeakSet()


def renew_after_fork(owner: ForkAware) -> None:
    """Have ``owner.after_fork()`` called in every forked child while ``owner`` lives."""
    _RENEWED.add(owner)


def _after_fork_in_child() -> None:
    for owner in list(_RENEWED):
        owner.after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)

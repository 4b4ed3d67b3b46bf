"""A producer made before its process forked: gunicorn ``--preload``, uWSGI, Celery's prefork
pool, ``multiprocessing`` with the ``fork`` start method.

librdkafka is not fork-safe: a client's threads do not survive ``fork()``. In the child, a client
made before the fork takes records and never sends them, so every half send there would time out
(``HalfSendError``, "is Kafka up?") and every transaction roll back; and ``close()`` would wait
forever for the parent's check server, whose thread is not in the child either.

So what a producer starts belongs to the process that started it (:class:`PerProcess`):

- **its Kafka clients are made again in a forked child**, on first use there. Records the parent
  had handed to librdkafka before the fork are the parent's to send; the child's copy of them is
  never sent, so nothing is sent twice.
- **what the parent started is left to the parent.** The child neither uses nor closes it: its
  check endpoint and heartbeat keep answering for the whole producer group (any instance of the
  group can answer any of its checks), and a child's ``close()`` does not tombstone them.
- **the parent's clients are never destroyed in the child**: destroying a librdkafka client whose
  threads are gone waits for them (about a second, measured), and they hold nothing the child
  needs. They are kept until the child exits.

The database is not this module's: a SQLAlchemy engine shared across a fork shares its pooled
connections, and SQLAlchemy's own advice applies (``engine.dispose(close=False)`` in the child,
or an engine made there).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

log = logging.getLogger("outbox")

_pid = os.getpid()
#: Guards making a value again; a new one in each child, since the parent's may have been held by
#: one of its threads at the fork, and would then stay locked in the child for ever.
_lock = threading.Lock()
#: What a child inherited and must not destroy (see the module's docstring).
_inherited: list[object] = []


def _after_fork_in_child() -> None:
    global _pid, _lock
    _pid = os.getpid()
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def current_pid() -> int:
    """This process's id, kept by an at-fork hook: no system call on the send path."""
    return _pid


class PerProcess(Generic[T]):
    """A value of the process that made it, made again by ``make`` on first use in a forked child.

    ``what`` names it in the one log line a child writes when it makes its own.
    """

    def __init__(self, make: Callable[[], T], what: str) -> None:
        self._make = make
        self._what = what
        self._value = make()
        self._pid = _pid

    def get(self) -> T:
        """This process's value: the one made here, or a new one if this is a forked child."""
        if self._pid == _pid:
            return self._value
        with _lock:
            if self._pid != _pid:
                parent, made = self._pid, self._make()
                _inherited.append(self._value)
                # the value before the pid: a thread that sees this process's pid sees its value
                self._value, self._pid = made, _pid
                log.info(
                    "process %d was forked from process %d after its %s were made: made its own "
                    "(librdkafka's threads do not survive a fork)",
                    _pid,
                    parent,
                    self._what,
                )
        return self._value

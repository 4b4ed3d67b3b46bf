"""Values of one process, made again in a process forked from it: gunicorn ``--preload``, uWSGI,
Celery's prefork pool, ``multiprocessing`` with the ``fork`` start method.

librdkafka is not fork-safe: a client's threads do not survive ``fork()``. In the child, a client
made before the fork takes records and never sends them, and destroying it waits for threads that
are not there (about a second per client, measured). So a Kafka client is held in a
:class:`PerProcess`: a forked child makes its own on first use, and never uses the one it
inherited, which, once replaced, is kept (:func:`keep`), never destroyed there. Records the parent
had handed to its client before the fork are the parent's to send; the child's copy of them is
never sent, so nothing is sent twice. What an :class:`~outbox.OutboxProducer` does with this is
its own (:meth:`~outbox.OutboxProducer.close`).

The process is told by ``os.getpid()`` on each use (0.18 us, measured), not by an at-fork hook,
so that it holds however the process was forked: a server may fork from C without running
Python's at-fork hooks (uWSGI does, unless given ``--py-call-osafterfork``; CPython itself needs
them once threads ran before the fork, so with a producer made before the fork give uWSGI that
option, or ``--lazy-apps``). Each process takes its own lock, looked up by its pid, for the same
reason: a lock copied by a fork while one of the parent's threads held it would stay locked in the
child for ever.

A process forked while another thread of its parent held a lock inherits it held; two such
locks (glibc's name lookups, the random generator of the OpenSSL librdkafka links) stop its Kafka
clients for good. So each Kafka client is made by :mod:`outbox.kafka_clients`, which checks for
them first in a forked process, raising a clear error instead (:mod:`outbox.fork_checks`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

# the checks, where a forked worker's code looks for them (README)
from outbox.fork_checks import check_forked_process as check_forked_process
from outbox.fork_checks import check_name_lookups as check_name_lookups

T = TypeVar("T")

log = logging.getLogger("outbox")

#: One lock per process (see the module's docstring); ``setdefault`` is atomic under the GIL.
_locks: dict[int, threading.Lock] = {}
#: Where :func:`keep` puts what it cannot keep with a reference of its own (no ctypes).
_kept: list[object] = []


def keep(inherited: object) -> None:
    """Never destroy ``inherited`` in this process: a Kafka client (or what holds one) made by the
    process this one was forked from.

    A reference that is never released, so not even the interpreter's exit destroys it (a list
    is cleared then): a worker holding an inherited confluent-kafka ``Producer`` exited in 1.02 s
    when a list held it, in 0.03 s this way (measured). Without ctypes, a list it is.
    """
    try:
        import ctypes

        incref = ctypes.pythonapi.Py_IncRef
    except (ImportError, AttributeError):  # pragma: no cover - no ctypes, or not CPython
        _kept.append(inherited)
        return
    incref.argtypes, incref.restype = [ctypes.py_object], None
    incref(inherited)


class PerProcess(Generic[T]):
    """A value of the process that made it; ``make`` makes another on first use in a forked child,
    which keeps the inherited one (:func:`keep`).

    ``what`` names it in the one log line a child writes when it makes its own; None, no line.
    """

    def __init__(self, make: Callable[[], T], what: str | None) -> None:
        self._make = make
        self._what = what
        self._value = make()
        self._pid = os.getpid()

    def get(self) -> T:
        """This process's value: the one made here, or a new one if this is a forked child."""
        pid = os.getpid()
        if self._pid == pid:
            return self._value
        with _locks.setdefault(pid, threading.Lock()):
            if self._pid != pid:
                parent, inherited = self._pid, self._value
                # the value before the pid: a thread that sees this process's pid sees its value
                self._value = self._make()
                self._pid = pid
                keep(inherited)
                if self._what is not None:
                    log.info(
                        "process %d was forked from process %d after its %s were made: made "
                        "its own",
                        pid,
                        parent,
                        self._what,
                    )
        return self._value

    def made_here(self) -> T | None:
        """The value if this process made it, else None: a child's inherited one is not its own
        to use or to close.

        A child's value being made by another of its threads is waited for, under the lock that
        thread holds: a ``close()`` that answered None there would leave the clients that thread
        is making open for ever. (In a child being refused its Kafka clients that wait is their
        check's, up to :data:`~outbox.fork_checks.FORK_CHECK_TIMEOUT_S`.)
        """
        pid = os.getpid()
        if self._pid == pid:
            return self._value
        with _locks.setdefault(pid, threading.Lock()):
            return self._value if self._pid == pid else None

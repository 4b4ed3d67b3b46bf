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

glibc has such a lock of its own: ``getaddrinfo`` holds one while it asks the kernel which
address families the host has (with ``AI_ADDRCONFIG``, which librdkafka passes on every
connection, and whenever a name has several addresses, as ``localhost`` has). A process forked
while another thread of its parent was in there (a Kafka client's, connecting: on its first
use, to a broker it just learned of, after a broker restart) inherits that lock held, and every
such lookup in it waits for ever: its Kafka clients would never connect, and closing them would
never return. So before a child makes its first value, :func:`check_name_lookups` tries one
lookup that takes that lock (a numeric address, no DNS) and raises
:class:`~outbox.errors.ForkedDuringNameLookupError` if it does not come back: a clear error
instead of a worker that hangs. Such a process cannot be mended, only replaced. Measured with
two parent threads looking names up without pause: 47 of 200 children forked were stuck.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from outbox.errors import ForkedDuringNameLookupError

T = TypeVar("T")

log = logging.getLogger("outbox")

#: One lock per process (see the module's docstring); ``setdefault`` is atomic under the GIL.
_locks: dict[int, threading.Lock] = {}
#: Where :func:`keep` puts what it cannot keep with a reference of its own (no ctypes).
_kept: list[object] = []


#: How long a forked process's first name lookup may take before it is called stuck for good. A
#: free lock answers in well under a millisecond (no DNS is asked); a held one never does.
NAME_LOOKUP_TIMEOUT_S = 5.0


class _Lookup:
    """One process's trial lookup, in a thread of its own: it may never come back."""

    def __init__(self, timeout_s: float) -> None:
        self.parent = os.getppid()
        self.done = threading.Event()
        self.deadline = time.monotonic() + timeout_s
        threading.Thread(target=self._run, name="outbox-name-lookup", daemon=True).start()

    def _run(self) -> None:
        with contextlib.suppress(OSError):  # an answer at all is what counts
            socket.getaddrinfo("127.0.0.1", 0, flags=socket.AI_ADDRCONFIG)
        self.done.set()


#: The trial lookup of each process that made one, by pid.
_lookups: dict[int, _Lookup] = {}


def check_name_lookups(timeout_s: float = NAME_LOOKUP_TIMEOUT_S) -> None:
    """Raise if this process can never look up a host name (see the module's docstring).

    The first call in a process starts a trial lookup and waits up to ``timeout_s`` for it;
    calls after that wait until the same deadline at most, then only look at its result (a
    lookup that came back late counts). Cheap to call again. A server can call it first thing
    in a forked worker (gunicorn's ``post_worker_init``, Celery's ``worker_process_init``) and
    exit on the error, so that the server forks a new one.

    Raises:
        ForkedDuringNameLookupError: no answer within ``timeout_s``.
    """
    pid = os.getpid()
    with _locks.setdefault(pid, threading.Lock()):
        lookup = _lookups.get(pid)
        if lookup is None:
            lookup = _lookups[pid] = _Lookup(timeout_s)
    if lookup.done.wait(max(0.0, lookup.deadline - time.monotonic())):
        return
    raise ForkedDuringNameLookupError(
        f"process {pid} cannot look up host names: it was forked from process {lookup.parent} "
        f"while another thread there was inside getaddrinfo (a Kafka client's, connecting), "
        f"and glibc's lock that thread held stays held here for ever; no Kafka client can "
        f"connect from this process, so none was made and nothing was sent. Replace this "
        f"worker (one forked again is almost always fine): call "
        f"outbox.forking.check_name_lookups() first thing in each worker and exit when it "
        f"raises, so that the server forks another; or avoid it, making Kafka clients after "
        f"the fork (gunicorn without --preload, Celery's worker_process_init)"
    )


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
        check_name_lookups()  # a child that cannot connect makes nothing that would hang
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
        is making open for ever.
        """
        pid = os.getpid()
        if self._pid == pid:
            return self._value
        with _locks.setdefault(pid, threading.Lock()):
            return self._value if self._pid == pid else None

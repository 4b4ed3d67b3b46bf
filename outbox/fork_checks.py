"""What a forked process checks before it makes a Kafka client: a lock it may have inherited held.

``fork()`` copies one thread, and every lock as it was at that instant: a lock another thread of
the parent held then stays held in the child for ever, with no thread there to release it. Two
such locks stop a child's Kafka clients for good, each taken by every client as it connects:

- **glibc's**: ``getaddrinfo`` holds one while it asks the kernel which address families the
  host has (with ``AI_ADDRCONFIG``, which librdkafka passes on every connection, and whenever a
  name has several addresses). A parent thread is in there whenever one of its Kafka clients
  connects: on its first use, to a broker it just learned of, after a broker restart. Measured
  with two parent threads looking names up without pause: 47 of 200 children forked were stuck.
- **OpenSSL's random generator, inside librdkafka** (which links its own copy): each of a
  client's threads seeds its random numbers (the jitter of its reconnect backoff) from OpenSSL's
  process-wide generator the first time it connects, and takes that generator's lock to do so.
  A parent's new client takes it from each of its threads within milliseconds of being made:
  the moment a preloading server forks its workers. Measured with four parent threads starting
  threads that each draw once (5,800 a second): 3 of 300 children forked were stuck; a child's
  broker threads then wait on that lock in ``rd_jitter``, and its first transaction waited out
  the send timeout ("Failed to get metadata: Local: Broker transport failure") although Kafka
  was up (seen as a fork test failing about one CI run in eight).

So before a forked process makes each Kafka client (:func:`check_if_forked`, which
:mod:`outbox.kafka_clients` calls), :func:`check_forked_process` tries, once per process and each
in a thread of its own, one lookup that takes glibc's lock (a numeric address, no DNS) and one
draw of librdkafka's random bytes (a SCRAM credential built and freed, no broker asked), and
raises :class:`~outbox.errors.ForkedWithLockHeldError` if one does not come back: a clear error
instead of a worker whose transactions all fail and whose ``close()`` never returns. Such a process
cannot be mended, only replaced.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable

import confluent_kafka
from confluent_kafka import cimpl

from outbox.errors import ForkedDuringNameLookupError, ForkedDuringRandomSeedError

try:  # imported here, not in a trial's thread: what stops there is the lock tried, nothing else
    import ctypes
except ImportError:  # pragma: no cover - a Python without ctypes: the random trial passes
    ctypes = None  # type: ignore[assignment]

#: How long a forked process's first trials may take before it is called stuck for good. A free
#: lock answers in well under a millisecond (no DNS is asked, no broker); a held one never does.
FORK_CHECK_TIMEOUT_S = 5.0

#: The first librdkafka whose threads seed their random numbers from OpenSSL (2.13.2;
#: ``rd_kafka_version()``): before it, from the time and the thread's id, and no lock is taken.
SEEDS_FROM_OPENSSL = 0x020D0200

#: ``rd_kafka_ScramMechanism_t``'s SCRAM-SHA-256: any valid mechanism builds the credential.
_SCRAM_SHA_256 = 1

#: The process that imported this module: one with another pid was forked from it (or from a
#: child of it), after the Kafka clients of the process it was forked from may have started.
#: Told by pid, not an at-fork hook, so that a fork from C counts too (:mod:`outbox.forking`).
#: Not seen: a process forked before ``outbox`` was imported (its parent made no client of ours;
#: one with clients of its own can call :func:`check_forked_process` in the child); a process
#: started by ``spawn`` imports afresh and inherits no lock.
_IMPORTED_IN = os.getpid()

#: What each process's trials hold, by pid: one lock, and each trial by name.
_locks: dict[int, threading.Lock] = {}
_trials: dict[tuple[int, str], _Trial] = {}


class _Trial:
    """One process's trial of a call that may never come back, in a thread of its own."""

    def __init__(self, name: str, call: Callable[[], None], timeout_s: float) -> None:
        self.parent = os.getppid()
        self.done = threading.Event()
        self.deadline = time.monotonic() + timeout_s
        thread = threading.Thread(target=self._run, args=(call,), name=f"outbox-fork-check-{name}")
        thread.daemon = True
        thread.start()

    def _run(self, call: Callable[[], None]) -> None:
        # an answer at all is what counts; a trial that cannot run here (no such call in this
        # librdkafka) passes: the check fails open, never refusing a worker for itself
        with contextlib.suppress(Exception):
            call()
        self.done.set()

    def passed(self) -> bool:
        """Whether the call came back by the deadline (waiting until then at most)."""
        return self.done.wait(max(0.0, self.deadline - time.monotonic()))


def _trial(name: str, call: Callable[[], None], timeout_s: float) -> _Trial:
    """This process's trial ``name``, started by the first call here."""
    pid = os.getpid()
    with _locks.setdefault(pid, threading.Lock()):
        trial = _trials.get((pid, name))
        if trial is None:
            trial = _trials[(pid, name)] = _Trial(name, call, timeout_s)
    return trial


def _look_up() -> None:
    socket.getaddrinfo("127.0.0.1", 0, flags=socket.AI_ADDRCONFIG)


def _draw_librdkafka_random() -> None:
    """Have librdkafka draw random bytes in this (new) thread, as each of its own threads does
    when it first connects: from the OpenSSL it links, whose process-wide generator seeds this
    thread's. Nothing if librdkafka's threads do not seed from OpenSSL (before 2.13.2)."""
    if ctypes is None or confluent_kafka.libversion()[1] < SEEDS_FROM_OPENSSL:
        return
    # confluent-kafka's extension, already loaded (never loaded again here): a symbol is looked
    # up in it and what it links, so this is the very librdkafka its clients use
    library = ctypes.CDLL(cimpl.__file__, mode=os.RTLD_NOLOAD)
    new = library.rd_kafka_UserScramCredentialUpsertion_new
    new.restype = ctypes.c_void_p
    new.argtypes = [
        ctypes.c_char_p,  # user
        ctypes.c_int,  # mechanism
        ctypes.c_int32,  # iterations
        ctypes.c_char_p,  # password
        ctypes.c_size_t,
        ctypes.c_char_p,  # salt: none, so librdkafka draws one (OpenSSL's RAND_priv_bytes)
        ctypes.c_size_t,
    ]
    destroy = library.rd_kafka_UserScramCredentialAlteration_destroy
    destroy.argtypes, destroy.restype = [ctypes.c_void_p], None
    credential = new(b"outbox-fork-check", _SCRAM_SHA_256, 4096, b"-", 1, None, 0)
    if credential:
        destroy(credential)


def check_name_lookups(timeout_s: float = FORK_CHECK_TIMEOUT_S) -> None:
    """Raise if this process can never look up a host name (glibc's lock, see the module's
    docstring). :func:`check_forked_process` checks this and librdkafka's random numbers.

    The first call in a process starts a trial lookup and waits up to ``timeout_s`` for it;
    calls after that wait until the same deadline at most, then only look at its result (a
    lookup that came back late counts). Cheap to call again.

    Raises:
        ForkedDuringNameLookupError: no answer within ``timeout_s``.
    """
    trial = _trial("name-lookup", _look_up, timeout_s)
    if not trial.passed():
        raise ForkedDuringNameLookupError(
            f"process {os.getpid()} cannot look up host names: it was forked from process "
            f"{trial.parent} while another thread there was inside getaddrinfo (a Kafka "
            f"client's, connecting), and glibc's lock that thread held stays held here for "
            f"ever; {_REPLACE}"
        )


def check_forked_process(timeout_s: float = FORK_CHECK_TIMEOUT_S) -> None:
    """Raise if this process can never connect a Kafka client: it inherited held a lock its
    clients need (see the module's docstring). Both trials run at once, each given up to
    ``timeout_s`` from the first call in the process that started it (the name lookup's may
    have been started by :func:`check_name_lookups`); later calls look at their results. A
    server can call it first thing in a forked worker (gunicorn's ``post_worker_init``,
    Celery's ``worker_process_init``) and exit on the error, so that the server forks another.
    A trial that cannot run here (a librdkafka older than 2.13.2, whose threads take no such
    lock, or without the call it makes) passes.

    Raises:
        ForkedDuringNameLookupError: no host name can be looked up here.
        ForkedDuringRandomSeedError: librdkafka's threads can never seed their random numbers.
    """
    random = _trial("librdkafka-random", _draw_librdkafka_random, timeout_s)
    check_name_lookups(timeout_s)
    if not random.passed():
        raise ForkedDuringRandomSeedError(
            f"process {os.getpid()} cannot connect a Kafka client: it was forked from process "
            f"{random.parent} while another thread there was seeding random numbers in the "
            f"OpenSSL librdkafka links (a Kafka client's, connecting), and the lock of OpenSSL's "
            f"generator that thread held stays held here for ever; {_REPLACE}"
        )


def check_if_forked(timeout_s: float = FORK_CHECK_TIMEOUT_S) -> None:
    """:func:`check_forked_process` in a process forked after this module was imported; in the
    process that imported it, nothing but ``os.getpid()``. The library calls it before it makes
    each Kafka client, so that a forked worker cannot make one that would never connect, whether
    it uses a producer made before the fork or makes its own (Celery's ``worker_process_init``
    in a master that made one too): :mod:`outbox.kafka_clients` calls it for each client.

    Raises:
        ForkedWithLockHeldError: as :func:`check_forked_process`.
    """
    if os.getpid() != _IMPORTED_IN:
        check_forked_process(timeout_s)


_REPLACE = (
    "no Kafka client can connect from this process, so none was made and nothing was sent. "
    "Replace this worker (one forked again is almost always fine): call "
    "outbox.forking.check_forked_process() first thing in each worker and exit when it raises, "
    "so that the server forks another; or avoid it, making no Kafka client in the process that "
    "forks (no OutboxProducer, serve_checks or ensure_topics there), only in each worker "
    "(gunicorn without --preload or in post_fork, Celery's worker_process_init)"
)

"""Which listener transactions are still running ``execute_local_transaction``: their checks
answer UNKNOWN without asking the listener (a slow local transaction is not yet a ROLLBACK).

A preloading server (gunicorn ``--preload``, uWSGI, Celery's prefork pool) makes the producer and
its check endpoint in the master and forks the workers that run the transactions; the master's
thread alone serves the checks (:mod:`outbox.forking`). A mark kept in the memory of the worker
running the transaction would not be seen there: the master would ask its listener, find no row
yet, and answer ROLLBACK for a transaction that then commits - its message never delivered. So a
process forked from the one that made the marks also marks each transaction with a file in a
private folder the processes share (``outbox-executing-*`` in the temporary folder, ``TMPDIR``;
mode 0700, and refused whenever anyone else owns it or may write to it). The worker holds an
``flock`` on its file while the transaction runs: a check in any of these processes looks in its
own memory, then for the file, and a file nobody holds a lock on any more (its process died in
the middle; the kernel drops the lock with the process, whatever its pid becomes) is removed and
the listener asked, as for a transaction that ended. A worker that cannot write its mark refuses
the transaction before anything is sent (:class:`~outbox.errors.ConfigurationError`) rather than
run it unguarded. The process that made the marks writes no files (a transaction of its own is
in its memory) and removes the folder when its producer closes or its interpreter exits.

Processes started with ``spawn`` or ``forkserver`` (``multiprocessing``'s default on macOS, and on
Linux from Python 3.14) are not forked from the producer: each makes its own, a separate instance
of the group, for which RocketMQ's rule holds (its listener answers UNKNOWN while it may commit).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import stat
import tempfile
import threading
import uuid
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

from outbox.errors import ConfigurationError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows, where nothing forks
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("outbox.checks")

#: Only a canonical transaction id names a file: a check's id is never a path.
_TXN_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_FOLDER_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)


class ExecutingMarks:
    """The transactions executing in this process and in the processes forked from it.

    Args:
        folder: where forked processes write their marks; by default a new name in the
            temporary folder, made by the first forked process that marks a transaction.
    """

    def __init__(self, folder: str | None = None) -> None:
        self.folder = folder or os.path.join(
            tempfile.gettempdir(), f"outbox-executing-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        )
        self._home = os.getpid()
        #: One lock per process: a lock a parent thread held at the fork stays held in the child.
        self._locks: dict[int, threading.Lock] = {}
        self._counts: Counter[str] = Counter()
        self._counts_pid = self._home
        #: This process's open, locked mark files, by transaction.
        self._files: dict[str, int] = {}
        weakref.finalize(self, _remove_at_home, self.folder, self._home)

    @contextmanager
    def executing(self, txn_id: str) -> Iterator[None]:
        """Marks ``txn_id`` as executing here until the block ends.

        Raises:
            ConfigurationError: a forked process could not write its mark (see the message).
        """
        release = self.hold(txn_id)
        try:
            yield
        finally:
            release()

    def hold(self, txn_id: str) -> Callable[[], None]:
        """Mark ``txn_id`` as executing until the returned function is called (a local
        transaction that goes on in a worker thread after its caller was cancelled).

        Raises:
            ConfigurationError: a forked process could not write its mark; nothing is marked.
        """
        with self._lock():
            counts = self._own_counts()
            if counts[txn_id] == 0 and os.getpid() != self._home:
                self._files[txn_id] = self._write(txn_id)
            counts[txn_id] += 1

        def release() -> None:
            with self._lock():
                counts = self._own_counts()
                counts[txn_id] -= 1
                if counts[txn_id] <= 0:
                    del counts[txn_id]
                    fd = self._files.pop(txn_id, None)
                    if fd is not None:
                        self._erase(txn_id, fd)

        return release

    def __contains__(self, txn_id: str) -> bool:
        """Whether ``txn_id`` is executing here or in a live process forked from the one that
        made the marks."""
        with self._lock():
            if txn_id in self._own_counts():
                return True
        return self._marked_elsewhere(txn_id)

    def remove(self) -> None:
        """Remove the shared folder (its producer closed); only in the process that made it."""
        _remove_at_home(self.folder, self._home)

    def _lock(self) -> threading.Lock:
        pid = os.getpid()
        return self._locks.get(pid) or self._locks.setdefault(pid, threading.Lock())

    def _own_counts(self) -> Counter[str]:
        """This process's marks: a forked child starts without its parent's (inherited, they
        would answer UNKNOWN for the parent's transactions long after they ended)."""
        if self._counts_pid != os.getpid():
            self._counts = Counter()
            # The parent's descriptors and locks are the parent's. (Left open here: their
            # numbers may be another file's by now. A worker that forks while it holds a mark
            # leaves it locked for as long as that child lives: read as running, UNKNOWN.)
            self._files = {}
            self._counts_pid = os.getpid()
        return self._counts

    def _write(self, txn_id: str) -> int:
        """The transaction's mark file, written, locked and in place; its open descriptor.

        Raises:
            ConfigurationError: it could not be.
        """
        if not _TXN_ID.fullmatch(txn_id) or fcntl is None:
            raise ConfigurationError(f"cannot mark transaction {txn_id!r} as executing")
        try:
            folder = _private_folder(self.folder, make=True)
            try:
                part = f"{txn_id}.{os.getpid()}.part"
                fd = os.open(part, _NEW_FILE_FLAGS, 0o600, dir_fd=folder)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    os.write(fd, str(os.getpid()).encode())
                    os.replace(part, txn_id, src_dir_fd=folder, dst_dir_fd=folder)
                except BaseException:
                    os.close(fd)
                    with suppress(OSError):
                        os.unlink(part, dir_fd=folder)
                    raise
            finally:
                os.close(folder)
        except OSError as err:
            raise ConfigurationError(
                f"process {os.getpid()}, forked from process {self._home} that serves this "
                f"producer's checks, could not mark transaction {txn_id} as executing in "
                f"{self.folder} ({err}); without the mark a check there could answer ROLLBACK "
                "while the transaction runs, so it is refused before anything is sent. Give "
                "the server a writable private temporary folder (TMPDIR), or make the producer "
                "after the fork"
            ) from err
        return fd

    def _erase(self, txn_id: str, fd: int) -> None:
        """Remove the mark, then let go of its lock: a check that opened it meanwhile and then
        gets the lock finds the transaction ended, which it has."""
        try:
            folder = _private_folder(self.folder, make=False)
            try:
                os.unlink(txn_id, dir_fd=folder)
            finally:
                os.close(folder)
        except OSError as err:
            if err.errno != errno.ENOENT:
                log.warning("could not remove the mark of %s in %s: %s", txn_id, self.folder, err)
        finally:
            os.close(fd)  # the lock goes with it: a mark left behind reads as ended

    def _marked_elsewhere(self, txn_id: str) -> bool:
        if not _TXN_ID.fullmatch(txn_id) or fcntl is None:
            return False
        try:
            folder = _private_folder(self.folder, make=False, reader=True)
        except FileNotFoundError:
            return False  # no process marked anything yet
        except OSError as err:  # not a ROLLBACK on a guess: the check comes again
            log.error(
                "the marks folder %s cannot be read or trusted (%s): checks of listener "
                "transactions answer UNKNOWN until it can",
                self.folder,
                err,
            )
            return True
        try:
            try:
                fd = os.open(txn_id, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0), dir_fd=folder)
            except FileNotFoundError:
                return False
            except OSError:
                return True  # there, unreadable: not a ROLLBACK on a guess
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True  # its process holds it: still running
            except OSError:
                return True
            finally:
                os.close(fd)
            with suppress(OSError):  # nobody holds it: its process died in the middle
                os.unlink(txn_id, dir_fd=folder)
            return False
        finally:
            os.close(folder)


def _private_folder(folder: str, *, make: bool, reader: bool = False) -> int:
    """An open descriptor of ``folder``, made (mode 0700) if ``make`` and missing, once it is
    known to be this user's own folder that nobody else may write to. A ``reader`` running as
    root also takes one another user made (gunicorn ``--user``: a root master, its workers
    switched to a service user), as long as only that user may write to it.

    Raises:
        FileNotFoundError: missing (and not ``make``).
        PermissionError: another user's folder, one others may write to, or a link.
    """
    if make:
        with suppress(FileExistsError):
            os.mkdir(folder, 0o700)
    fd = os.open(folder, _FOLDER_FLAGS)
    info = os.fstat(fd)
    euid = os.geteuid()
    owner_ok = info.st_uid == euid or (reader and euid == 0)
    if not stat.S_ISDIR(info.st_mode) or not owner_ok or info.st_mode & 0o077:
        os.close(fd)
        raise PermissionError(errno.EPERM, "not a private folder of this user", folder)
    return fd


def _remove_at_home(folder: str, home: int) -> None:
    if os.getpid() == home:  # a forked child's exit must not remove its parent's folder
        shutil.rmtree(folder, ignore_errors=True)

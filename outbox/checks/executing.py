"""Which listener transactions are still running ``execute_local_transaction``: their checks
answer UNKNOWN without asking the listener (a slow local transaction is not yet a ROLLBACK).

A preloading server (gunicorn ``--preload``, uWSGI, Celery's prefork pool) makes the producer and
its check endpoint in the master and forks the workers that run the transactions; the master's
thread alone serves the checks (:mod:`outbox.forking`). A mark kept in the memory of the worker
running the transaction would not be seen there: the master would ask its listener, find no row
yet, and answer ROLLBACK for a transaction that then commits - its message never delivered. So a
process forked from the one that made the marks also marks each transaction with a file in a
private folder the processes share (``outbox-executing-*`` in the temporary folder, made with
mode 0700 and refused if anyone else owns it): the file names the transaction and holds the pid
of the process running it, and is written under another name and renamed, so it is never seen
empty. A check in any of these processes looks in its own memory, then for the file; a file
whose process is gone (killed in the middle) is removed and the listener asked, as for a
transaction that ended. The process that made the marks writes no files (a transaction of its
own is in its memory) and removes the folder when its producer closes or its interpreter exits.
"""

from __future__ import annotations

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

log = logging.getLogger("outbox.checks")

#: Only a canonical transaction id names a file: a check's id is never a path.
_TXN_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


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
        self._ready = False  # the folder checked in this process
        weakref.finalize(self, _remove_at_home, self.folder, self._home)

    @contextmanager
    def executing(self, txn_id: str) -> Iterator[None]:
        """Marks ``txn_id`` as executing here until the block ends."""
        release = self.hold(txn_id)
        try:
            yield
        finally:
            release()

    def hold(self, txn_id: str) -> Callable[[], None]:
        """Mark ``txn_id`` as executing until the returned function is called (a local
        transaction that goes on in a worker thread after its caller was cancelled)."""
        with self._lock():
            counts = self._own_counts()
            counts[txn_id] += 1
            if counts[txn_id] == 1 and os.getpid() != self._home:
                self._write(txn_id)

        def release() -> None:
            with self._lock():
                counts = self._own_counts()
                counts[txn_id] -= 1
                if counts[txn_id] <= 0:
                    del counts[txn_id]
                    if os.getpid() != self._home:
                        _unlink(os.path.join(self.folder, txn_id))

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
        return self._locks.setdefault(os.getpid(), threading.Lock())

    def _own_counts(self) -> Counter[str]:
        """This process's marks: a forked child starts without its parent's (inherited, they
        would answer UNKNOWN for the parent's transactions long after they ended)."""
        if self._counts_pid != os.getpid():
            self._counts = Counter()
            self._counts_pid = os.getpid()
            self._ready = False
        return self._counts

    def _write(self, txn_id: str) -> None:
        if not _TXN_ID.fullmatch(txn_id):
            return  # every id this project makes is canonical
        try:
            if not self._ready:
                _private_folder(self.folder)
                self._ready = True
            final = os.path.join(self.folder, txn_id)
            part = f"{final}.{os.getpid()}.part"
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)
            os.replace(part, final)
        except OSError as err:
            log.error(
                "could not mark transaction %s as executing in %s (%s): a check answered by "
                "another process of this server meanwhile asks the listener",
                txn_id,
                self.folder,
                err,
            )

    def _marked_elsewhere(self, txn_id: str) -> bool:
        if not _TXN_ID.fullmatch(txn_id):
            return False
        path = os.path.join(self.folder, txn_id)
        try:
            with open(path, "rb") as file:
                pid = int(file.read())
        except FileNotFoundError:
            return False
        except (OSError, ValueError):
            return True  # there, unreadable: not a ROLLBACK on a guess
        if pid == os.getpid() or _alive(pid):
            return True
        _unlink(path)  # its process died: the transaction ended one way or the other
        return False


def _private_folder(folder: str) -> None:
    """Make ``folder`` (mode 0700) or accept it if this user owns it and no one else may write
    to it.

    Raises:
        PermissionError: another user's folder, or a link, under that name.
    """
    with suppress(FileExistsError):
        os.mkdir(folder, 0o700)
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise PermissionError(f"{folder} is not a private folder of this user")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as err:
        log.warning("could not remove %s: %s", path, err)


def _remove_at_home(folder: str, home: int) -> None:
    if os.getpid() == home:  # a forked child's exit must not remove its parent's folder
        shutil.rmtree(folder, ignore_errors=True)

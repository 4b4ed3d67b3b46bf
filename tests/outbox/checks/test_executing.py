"""Marks of listener transactions still executing, seen across a fork
(:mod:`outbox.checks.executing`); the end-to-end case, a preloading server's master answering
the checks of its worker's slow transaction, is in ``tests/outbox/test_forking.py``."""

from __future__ import annotations

import os
import signal
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from outbox.checks.executing import ExecutingMarks
from outbox.protocol.ids import new_transaction_id


@pytest.fixture
def marks(tmp_path: Path) -> Iterator[ExecutingMarks]:
    made = ExecutingMarks(str(tmp_path / "marks"))
    yield made
    made.remove()


@contextmanager
def child(work: Callable[[], None]) -> Iterator[tuple[int, Callable[[], None]]]:
    """A forked process that runs ``work``, tells the parent, and waits to be told to exit;
    yields its pid and the function that lets it exit (and waits for it)."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            try:
                work()
            except BaseException:
                os.write(ready_w, b"0")
                raise
            os.write(ready_w, b"1")
            os.read(go_r, 1)
        finally:
            os._exit(0)
    assert os.read(ready_r, 1) == b"1", "the child's work failed"

    def finish() -> None:
        os.write(go_w, b"1")
        os.waitpid(pid, 0)

    try:
        yield pid, finish
    finally:
        for fd in (ready_r, ready_w, go_r, go_w):
            os.close(fd)
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def test_in_the_process_that_made_them_marks_are_kept_in_memory(marks: ExecutingMarks) -> None:
    txn_id = new_transaction_id()
    with marks.executing(txn_id):
        assert txn_id in marks
        release = marks.hold(txn_id)  # a cancelled caller's worker thread goes on
    assert txn_id in marks
    release()
    assert txn_id not in marks
    assert not os.path.exists(marks.folder)  # no file written: nothing else to tell


def test_a_forked_workers_transaction_is_seen_while_it_runs_and_not_after(
    marks: ExecutingMarks,
) -> None:
    txn_id = new_transaction_id()
    in_worker: list[Callable[[], None]] = []

    def worker() -> None:
        in_worker.append(marks.hold(txn_id))

    with child(worker) as (_, finish):
        assert txn_id in marks
        assert new_transaction_id() not in marks
        info = os.stat(marks.folder)
        assert stat.S_IMODE(info.st_mode) == 0o700
        assert [p.name for p in Path(marks.folder).iterdir()] == [txn_id]
        finish()  # exits without releasing: killed in the middle, as far as the marks know
    # Then its process being gone, the mark is stale: removed, the listener asked
    assert txn_id not in marks
    assert list(Path(marks.folder).iterdir()) == []


def test_a_worker_that_ends_its_transaction_removes_its_mark(marks: ExecutingMarks) -> None:
    txn_id = new_transaction_id()
    seen: list[bool] = []

    def worker() -> None:
        with marks.executing(txn_id):
            seen.append(txn_id in marks)
        assert seen == [True]

    with child(worker) as (_, finish):
        assert txn_id not in marks  # ended there before the parent looked
        assert list(Path(marks.folder).iterdir()) == []
        finish()


def test_a_worker_killed_while_its_transaction_runs_leaves_no_unknown_for_ever(
    marks: ExecutingMarks,
) -> None:
    txn_id = new_transaction_id()
    with child(lambda: marks.hold(txn_id) and None) as (pid, _):
        assert txn_id in marks
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        assert txn_id not in marks


def test_a_child_starts_without_its_parents_marks(marks: ExecutingMarks) -> None:
    """Inherited, they would answer UNKNOWN in a child serving checks for transactions the
    parent ended long ago."""
    txn_id = new_transaction_id()
    release = marks.hold(txn_id)
    seen: list[bool] = []
    read_end, write_end = os.pipe()

    def worker() -> None:
        os.write(write_end, b"1" if txn_id in marks else b"0")
        marks.remove()  # not the child's to remove

    with child(worker) as (_, finish):
        seen.append(os.read(read_end, 1) == b"1")
        finish()
    os.close(read_end)
    os.close(write_end)
    assert seen == [False]
    assert txn_id in marks
    release()


def test_a_folder_others_may_write_to_is_refused_and_a_check_id_is_never_a_path(
    marks: ExecutingMarks, caplog: pytest.LogCaptureFixture
) -> None:
    os.mkdir(marks.folder)
    os.chmod(marks.folder, 0o777)
    txn_id = new_transaction_id()
    with child(lambda: marks.hold(txn_id) and None) as (_, finish):
        assert list(Path(marks.folder).iterdir()) == []  # not marked there
        assert txn_id not in marks
        finish()
    os.chmod(marks.folder, 0o700)
    with child(lambda: marks.hold("../escape") and None) as (_, finish):
        assert "../escape" not in marks
        assert list(Path(marks.folder).iterdir()) == []
        assert not os.path.exists(os.path.join(os.path.dirname(marks.folder), "escape"))
        finish()


def test_the_folder_is_removed_by_the_process_that_made_it(tmp_path: Path) -> None:
    marks = ExecutingMarks(str(tmp_path / "marks"))
    with child(lambda: marks.hold(new_transaction_id()) and None) as (_, finish):
        deadline = time.monotonic() + 5
        while not os.path.exists(marks.folder) and time.monotonic() < deadline:
            time.sleep(0.01)
        finish()
    assert os.path.isdir(marks.folder)
    marks.remove()
    assert not os.path.exists(marks.folder)

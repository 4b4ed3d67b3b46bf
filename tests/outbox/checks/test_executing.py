"""Marks of listener transactions still executing, seen across a fork
(:mod:`outbox.checks.executing`); the end-to-end case, a preloading server's master answering
the checks of its worker's slow transaction, is in ``tests/outbox/test_forking.py``."""

from __future__ import annotations

import os
import select
import signal
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
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
def child(
    work: Callable[[], object], timeout: float = 10
) -> Iterator[tuple[int, str, Callable[[], None]]]:
    """A forked process that runs ``work``, reports what it returned (``"ok: ..."``) or raised
    (``"TypeName: message"``), and waits to be told to exit; yields its pid, the report and the
    function that lets it exit (and waits for it). Killed at the end whatever happened."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            os.close(go_w)
            try:
                said = f"ok: {work()}"
            except BaseException as err:
                said = f"{type(err).__name__}: {err}"
            os.write(ready_w, said.encode())
            os.close(ready_w)
            os.read(go_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(go_r)
    try:
        readable, _, _ = select.select([ready_r], [], [], timeout)
        assert readable, f"the child said nothing within {timeout} s"
        report = os.read(ready_r, 65536).decode()

        def finish() -> None:
            os.write(go_w, b"1")
            os.waitpid(pid, 0)

        yield pid, report, finish
    finally:
        os.close(ready_r)
        with suppress(OSError):
            os.close(go_w)
        with suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


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
    with child(lambda: marks.hold(txn_id)) as (_, report, finish):
        assert report.startswith("ok")
        assert txn_id in marks
        assert new_transaction_id() not in marks
        assert stat.S_IMODE(os.stat(marks.folder).st_mode) == 0o700
        assert [p.name for p in Path(marks.folder).iterdir()] == [txn_id]
        assert txn_id in marks  # looking leaves the mark as it is
        finish()  # exits without releasing: killed in the middle, as far as the marks know
    # Then, its process gone (and with it the lock on its mark), the mark is stale: removed,
    # the listener asked - whatever the pid is given to next
    assert txn_id not in marks
    assert list(Path(marks.folder).iterdir()) == []


def test_a_worker_that_ends_its_transaction_removes_its_mark(marks: ExecutingMarks) -> None:
    txn_id = new_transaction_id()

    def worker() -> bool:
        with marks.executing(txn_id):
            seen = txn_id in marks
        return seen and txn_id not in marks

    with child(worker) as (_, report, finish):
        assert report == "ok: True"
        assert txn_id not in marks
        assert list(Path(marks.folder).iterdir()) == []
        finish()


def test_a_worker_killed_while_its_transaction_runs_leaves_no_unknown_for_ever(
    marks: ExecutingMarks,
) -> None:
    txn_id = new_transaction_id()
    with child(lambda: marks.hold(txn_id)) as (pid, report, _):
        assert report.startswith("ok") and txn_id in marks
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        assert txn_id not in marks


def test_a_child_starts_without_its_parents_marks_and_leaves_the_folder(
    marks: ExecutingMarks,
) -> None:
    """Inherited, the parent's marks would answer UNKNOWN in a child serving checks for
    transactions the parent ended long ago; and the folder is the parent's to remove."""
    txn_id = new_transaction_id()
    release = marks.hold(txn_id)

    def worker() -> bool:
        marks.hold(new_transaction_id())  # the folder made, a mark in it
        seen = txn_id in marks
        marks.remove()  # not the child's to remove
        return seen

    with child(worker) as (_, report, finish):
        assert report == "ok: False"
        assert os.path.isdir(marks.folder)
        finish()
    assert txn_id in marks
    release()
    assert txn_id not in marks
    marks.remove()
    assert not os.path.exists(marks.folder)


def test_a_worker_that_cannot_mark_refuses_the_transaction(marks: ExecutingMarks) -> None:
    """Run unmarked, a check at the master could answer ROLLBACK while it runs."""
    os.mkdir(marks.folder)
    os.chmod(marks.folder, 0o777)  # anyone may write: not to be trusted
    txn_id = new_transaction_id()
    with child(lambda: marks.hold(txn_id)) as (_, report, finish):
        assert report.startswith("ConfigurationError") and "TMPDIR" in report, report
        assert list(Path(marks.folder).iterdir()) == []
        finish()
    os.chmod(marks.folder, 0o700)
    with child(lambda: marks.hold("../escape")) as (_, report, finish):
        assert report.startswith("ConfigurationError"), report
        assert "../escape" not in marks
        assert list(Path(marks.folder).iterdir()) == []
        assert not os.path.exists(os.path.join(os.path.dirname(marks.folder), "escape"))
        finish()


def test_a_folder_others_may_write_to_answers_unknown_never_a_guess(
    marks: ExecutingMarks, caplog: pytest.LogCaptureFixture
) -> None:
    """Its marks cannot be believed, and neither can their absence: every check of a listener
    transaction answers UNKNOWN (and comes again) until it can be read, loudly."""
    txn_id = new_transaction_id()
    with child(lambda: marks.hold(txn_id)) as (_, report, finish):
        assert report.startswith("ok") and txn_id in marks
        os.chmod(marks.folder, 0o777)
        assert txn_id in marks
        assert new_transaction_id() in marks
        assert "cannot be read or trusted" in caplog.text
        os.chmod(marks.folder, 0o700)
        assert new_transaction_id() not in marks
        finish()

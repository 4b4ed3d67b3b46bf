"""The local services' processes and folders a killed session left, judged by their owner."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from outbox.testing.left_processes import (
    OWNER_ENV,
    OWNER_FILE,
    left_folders,
    left_processes,
    new_workdir,
    remove_left_processes,
)
from outbox.testing.owners import this_process

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

#: A service stand-in that ignores SIGTERM (a broker stuck in its shutdown).
STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(300)"
)


def _gone_owner() -> str:
    """The owner value of a process that has ended."""
    code = "from outbox.testing.owners import this_process; print(this_process())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts, killed at its end whatever it asserted."""
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait(10)


def _service(
    started: list[subprocess.Popen[str]],
    owner: str,
    code: str | None = None,
    *,
    program: str = "sleep",
) -> int:
    process = subprocess.Popen(
        [sys.executable, "-c", code] if code else [program, "300"],
        env={**os.environ, OWNER_ENV: owner},
        stdout=subprocess.PIPE,
        text=True,
    )
    started.append(process)
    if code:  # its handler is installed once it says so
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    _wait_for_its_environment(process.pid, owner)
    return process.pid


def _wait_for_its_environment(pid: int, owner: str) -> None:
    """Until ``/proc/<pid>/environ`` names the owner. ``Popen`` returns once the child's
    close-on-exec pipe closed, early in ``execve``; the new program's environment is set up
    after that, and until then the file reads empty (13 of 2,000 fresh ``sleep`` processes
    read at once on an idle machine): a search made in that window would not see the process
    at all, which is not what these tests are about."""
    wanted = f"{OWNER_ENV}={owner}".encode()
    deadline = time.monotonic() + 10
    while wanted not in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        assert time.monotonic() < deadline, f"process {pid} showed no environment in 10 s"
        time.sleep(0.001)


def test_a_gone_owners_processes_are_stopped_and_a_live_or_unknown_owners_stay(
    started: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    left = _service(started, _gone_owner())
    ours = _service(started, this_process())
    malformed = _service(started, "not an owner")
    assert left in left_processes()
    assert ours not in left_processes() and malformed not in left_processes()

    stopped = remove_left_processes(grace_s=10, tmp=tmp_path)

    assert left in stopped and ours not in stopped and malformed not in stopped
    assert started[0].wait(10) == -signal.SIGTERM
    assert started[1].poll() is None and started[2].poll() is None


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace(
    started: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    stubborn = _service(started, _gone_owner(), STUBBORN)

    assert stubborn in remove_left_processes(grace_s=0.5, tmp=tmp_path)
    assert started[0].wait(10) == -signal.SIGKILL


def test_only_the_services_folders_of_a_gone_owner_are_removed(tmp_path: Path) -> None:
    gone, alive = _gone_owner(), this_process()
    folders = {
        "outbox-pg-left": gone,
        "outbox-kafka-left": gone,
        "outbox-cluster-left": gone,
        "outbox-registry-left": gone,
        "outbox-connect-left": gone,
        "outbox-kafka-this": alive,
        "outbox-pg-malformed": "not an owner",
        "outbox-pg-unlabelled": None,  # an older session's, or one being created
        "outbox-demo-left": gone,  # not a service's folder
    }
    for name, owner in folders.items():
        (tmp_path / name / "data").mkdir(parents=True)
        if owner is not None:
            (tmp_path / name / OWNER_FILE).write_text(owner)
    left = [f"outbox-{kind}-left" for kind in ("cluster", "connect", "kafka", "pg", "registry")]
    assert [f.name for f in left_folders(tmp_path)] == left

    remove_left_processes(tmp=tmp_path)

    assert sorted(f.name for f in tmp_path.iterdir()) == sorted(set(folders) - set(left))


def test_postgresql_gets_a_fast_shutdown_not_a_smart_one(
    started: list[subprocess.Popen[str]], tmp_path: Path
) -> None:
    """SIGTERM would make a postmaster wait for its clients, e.g. a killed session's orphaned
    relay; SIGINT disconnects them. A stand-in named ``postgres`` shows which it gets."""
    postgres = tmp_path / "postgres"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", postgres)
    pid = _service(started, _gone_owner(), program=str(postgres))

    assert pid in remove_left_processes(grace_s=10, tmp=tmp_path)
    assert started[0].wait(10) == -signal.SIGINT


def test_without_pidfds_the_processes_are_stopped_all_the_same(
    started: list[subprocess.Popen[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kernels before 5.3, gVisor or a seccomp profile refuse ``pidfd_open``: the pid is
    signalled directly (after the same owner check), not taken for gone."""

    def refused(pid: int, flags: int = 0) -> int:
        raise OSError(errno.ENOSYS, "pidfd_open")

    monkeypatch.setattr(os, "pidfd_open", refused)
    left = _service(started, _gone_owner())

    assert left in remove_left_processes(grace_s=10, tmp=tmp_path)
    assert started[0].wait(10) == -signal.SIGTERM


def test_a_folder_stays_while_a_process_of_its_owner_still_runs(
    started: list[subprocess.Popen[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process no signal stopped (here: the signals through its pidfd go nowhere) may
    still write in its folder: the folder is removed by a later start, once it has stopped."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        pytest.skip("no pidfds on this kernel: the signals would go through kill()")
    gone = _gone_owner()
    (tmp_path / "outbox-kafka-left").mkdir()
    (tmp_path / "outbox-kafka-left" / OWNER_FILE).write_text(gone)
    _service(started, gone)
    # only the signal is lost: kill(pid, 0), which owners.gone() asks, still answers
    monkeypatch.setattr(signal, "pidfd_send_signal", lambda *args: None)

    remove_left_processes(grace_s=0.2, tmp=tmp_path)

    assert started[0].poll() is None
    assert (tmp_path / "outbox-kafka-left").is_dir()
    monkeypatch.undo()
    remove_left_processes(grace_s=10, tmp=tmp_path)
    assert started[0].wait(10) == -signal.SIGTERM
    assert not (tmp_path / "outbox-kafka-left").exists()


def test_a_new_workdir_is_owned_by_this_process_and_made_after_the_leftovers_went() -> None:
    left = Path(tempfile.mkdtemp(prefix="outbox-pg-"))
    (left / OWNER_FILE).write_text(_gone_owner())
    folder = new_workdir("outbox-kafka-")
    try:
        assert not left.exists()
        assert folder.name.startswith("outbox-kafka-")
        assert (folder / OWNER_FILE).read_text() == this_process()
        assert [p.name for p in folder.iterdir()] == [OWNER_FILE]  # no half-written copy left
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(left, ignore_errors=True)

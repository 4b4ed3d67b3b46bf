"""Which process owns a service container, and whether it still runs
(:mod:`outbox.testing.owners`): what lets a session remove the containers of a killed one
(:func:`outbox.testing.containers.stale`) and never those of a session still running. The removal
itself, on a real engine: ``tests/outbox/testing/test_providers.py``."""

from __future__ import annotations

import os
import select
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from outbox.testing.containers import stale
from outbox.testing.owners import OWNER_LABEL, gone, this_process

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="owners are told apart through Linux's /proc"
)


PRINT_OWNER = "from outbox.testing.owners import this_process; print(this_process(), flush=True)"


def ended_process_owner() -> str:
    """The owner label of a process that has run and ended (and been reaped)."""
    done = subprocess.run(
        [sys.executable, "-c", PRINT_OWNER], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def replaced(owner: str, part: int, value: str) -> str:
    parts = owner.split("/")
    parts[part] = value
    return "/".join(parts)


def test_this_process_is_not_gone_and_an_ended_one_is() -> None:
    owner = this_process()
    host, namespace, clock, boot, pid, started = owner.split("/")
    assert (host, pid) == (socket.gethostname(), str(os.getpid()))
    assert namespace.startswith("pid:[") and clock and len(boot) == 36
    assert started.isdigit()
    assert not gone(owner)
    ended = ended_process_owner()
    assert int(ended.split("/")[5]) >= int(started)  # started later, in clock ticks since boot
    assert gone(ended)


def test_a_pid_given_to_another_process_since_is_gone() -> None:
    owner = this_process()
    assert gone(replaced(owner, 5, str(int(owner.split("/")[5]) + 1)))


def test_a_killed_session_not_reaped_yet_is_gone() -> None:
    """Killed with -9, a session is a zombie until its parent waits for it: its /proc entry,
    start time and all, is still there, but it runs no more."""
    child = subprocess.Popen(
        [sys.executable, "-c", PRINT_OWNER + "\nimport time; time.sleep(60)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], 60)
        owner = child.stdout.readline().strip() if ready else ""
        assert owner and not gone(owner)
        os.kill(child.pid, 9)
        for _ in range(100):  # until the kernel has made it a zombie
            if Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
            time.sleep(0.05)
        assert gone(owner)  # not reaped (nobody waited yet)
    finally:
        child.kill()
        child.wait(30)
    assert gone(owner)


def test_the_start_time_is_read_past_a_command_name_with_spaces_and_parentheses() -> None:
    """``/proc/<pid>/stat`` puts the command name in parentheses; a name holding ``) `` must not
    shift the fields (a wrong field would still be a number)."""
    rename = (
        "import ctypes; "
        "ctypes.CDLL(None).prctl(15, b'x) 1 2 3 (y', 0, 0, 0); "  # PR_SET_NAME
        "print(open('/proc/self/comm').read().strip(), flush=True); "
    )
    done = subprocess.run(
        [sys.executable, "-c", PRINT_OWNER + "\n" + rename + PRINT_OWNER],
        capture_output=True,
        text=True,
        check=True,
    )
    before, name, after = done.stdout.split("\n")[:3]
    assert name == "x) 1 2 3 (y"
    assert after == before


def test_what_cannot_be_told_is_never_gone() -> None:
    ended = ended_process_owner()
    assert gone(ended)
    assert not gone(replaced(ended, 0, "another-host.example"))
    assert not gone(replaced(ended, 1, "pid:[1]"))  # another pid namespace: its pids are not ours
    assert not gone(replaced(ended, 2, "time:[1]"))  # another time namespace: other start times
    assert not gone(replaced(ended, 3, "00000000-0000-0000-0000-000000000000"))  # another boot
    assert not gone(f"{socket.gethostname()}///{ended.split('/', 4)[4]}")  # /proc unreadable
    for malformed in (
        "not an owner label",
        replaced(ended, 4, "not-a-pid"),
        replaced(ended, 4, "²"),
        replaced(ended, 4, "1" * 25),
        replaced(ended, 5, "abc"),
        replaced(ended, 5, ""),
        ended + "/more",
    ):
        assert not gone(malformed), malformed


@pytest.mark.skipif(shutil.which("unshare") is None, reason="no unshare(1)")
def test_a_session_in_another_pid_namespace_with_this_host_name_is_never_gone() -> None:
    """A session in a container sharing this host's name (``--uts host``) has pids this one
    cannot look up: its pid 1, say, is not this namespace's."""
    try:
        child = subprocess.Popen(
            [
                "unshare",
                "--pid",
                "--fork",
                "--kill-child",  # the child goes with unshare (killed below)
                "--mount-proc",
                sys.executable,
                "-c",
                PRINT_OWNER + "\nimport time; time.sleep(60)",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    except OSError as err:
        pytest.skip(f"unshare: {err}")
    try:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], 60)
        owner = child.stdout.readline().strip() if ready else ""
        if not owner:
            pytest.skip(
                f"cannot make a pid namespace here: {child.stderr.read() if child.stderr else ''}"
            )
        assert owner.split("/")[0] == socket.gethostname()
        assert owner.split("/")[1] != this_process().split("/")[1]
        assert not gone(owner)
    finally:
        child.kill()
        child.wait(30)
    assert not gone(owner)  # ended, but not where this session can tell: left alone


def test_which_containers_are_left_behind() -> None:
    alive = {OWNER_LABEL: this_process(), "outbox.testing": "1"}
    dead = {OWNER_LABEL: ended_process_owner(), "outbox.testing": "1"}
    older = {"outbox.testing": "1"}  # started before containers carried their owner
    for status in ("running", "exited", "created", "dead", "paused"):
        assert stale(status, dead)
        assert not stale(status, alive)  # restarting (exited) or starting (created): its own
    for status in ("exited", "created", "dead"):
        assert stale(status, older)
    assert not stale("running", older)

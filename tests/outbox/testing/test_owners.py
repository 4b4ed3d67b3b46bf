"""Which process owns a service container, and whether it still runs
(:mod:`outbox.testing.owners`): what lets a session remove the running containers of a killed one
(:func:`outbox.testing.containers.stale`) and never those of a session still running. The removal
itself, on a real engine: ``tests/outbox/testing/test_providers.py``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from outbox.testing.containers import stale
from outbox.testing.owners import OWNER_LABEL, gone, this_process

PRINT_OWNER = "from outbox.testing.owners import this_process; print(this_process())"


def ended_process_owner() -> str:
    """The owner label of a process that has run and ended (and been reaped)."""
    done = subprocess.run(
        [sys.executable, "-c", PRINT_OWNER], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_this_process_is_not_gone_and_an_ended_one_is() -> None:
    owner = this_process()
    host, pid, started = owner.split("/")
    assert (host, pid) == (socket.gethostname(), str(os.getpid()))
    assert started.isdigit()
    assert not gone(owner)
    assert gone(ended_process_owner())


def test_a_pid_given_to_another_process_since_is_gone() -> None:
    host, pid, started = this_process().split("/")
    assert gone(f"{host}/{pid}/{int(started) + 1}")  # the same pid, started at another time


def test_what_cannot_be_told_is_never_gone() -> None:
    ended = ended_process_owner()
    _, pid, started = ended.split("/")
    assert not gone(f"another-host.example/{pid}/{started}")  # another host's process
    assert not gone("not an owner label")
    assert not gone(f"{socket.gethostname()}/not-a-pid/1")
    assert not gone(f"{socket.gethostname()}/{os.getpid()}/")  # no start time: the pid runs
    assert not gone(f"{socket.gethostname()}/1/")  # init: runs (someone else's or not)


def test_which_containers_are_left_behind() -> None:
    alive = {OWNER_LABEL: this_process(), "outbox.testing": "1"}
    dead = {OWNER_LABEL: ended_process_owner(), "outbox.testing": "1"}
    older = {"outbox.testing": "1"}  # started before containers carried their owner
    for status in ("exited", "created", "dead"):
        assert stale(status, alive) and stale(status, dead) and stale(status, older)
    assert stale("running", dead)
    assert not stale("running", alive)
    assert not stale("running", older)
    assert stale("paused", dead) and not stale("paused", alive)

"""Commit witnesses (outbox.witnesses): bounded, recorded without ever failing a COMMIT that
happened, and usable in a forked child whatever the parent's threads were doing."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from outbox.witnesses import MAX_DATABASES, CommitWitnesses, witness_commit


def test_the_witnesses_keep_the_latest_of_a_bounded_number_of_databases() -> None:
    witnesses = CommitWitnesses()
    for n in range(MAX_DATABASES + 1):
        witnesses.committed(f"sqlite:///db{n}", f"t{n}")
    witnesses.committed("sqlite:///db1", "t1-later")
    latest = witnesses.latest()
    assert len(latest) == MAX_DATABASES
    assert "sqlite:///db0" not in latest  # the least recently committed to went first
    assert latest["sqlite:///db1"] == "t1-later"
    assert list(latest)[-1] == "sqlite:///db1"


def test_a_witness_names_the_database_without_its_password() -> None:
    witnesses = CommitWitnesses()
    engine = sa.create_engine("postgresql+psycopg://app:s3cret@db.example:5432/orders")
    witness_commit(witnesses, Session(engine), "t1")
    assert witnesses.latest() == {"postgresql+psycopg://app:***@db.example:5432/orders": "t1"}


def test_a_witness_follows_an_engine_whose_url_is_replaced() -> None:
    witnesses = CommitWitnesses()
    engine = sa.create_engine("postgresql+psycopg://app:s3cret@db.example:5432/orders")
    witness_commit(witnesses, Session(engine), "t1")
    engine.url = sa.make_url("postgresql+psycopg://app:other@db2.example:5432/orders")
    witness_commit(witnesses, Session(engine), "t2")  # not the first URL's rendering again
    assert witnesses.latest() == {
        "postgresql+psycopg://app:***@db.example:5432/orders": "t1",
        "postgresql+psycopg://app:***@db2.example:5432/orders": "t2",
    }


class _Slotted:
    """A bind that takes no weak reference (a proxy with ``__slots__``, say)."""

    __slots__ = ("url",)

    def __init__(self, url: str) -> None:
        self.url = sa.make_url(url)


def test_a_bind_that_takes_no_weak_reference_is_still_named() -> None:
    class Routed(Session):  # a routing session, as a sharded or read/write split one is
        def get_bind(self, *args: Any, **kwargs: Any) -> Any:
            return _Slotted("postgresql://app:pw@db3.example/orders")

    witnesses = CommitWitnesses()
    witness_commit(witnesses, Routed(), "t1")
    assert witnesses.latest() == {"postgresql://app:***@db3.example/orders": "t1"}


def test_a_session_that_cannot_name_its_database_costs_the_witness_not_the_commit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    witnesses = CommitWitnesses()
    with caplog.at_level(logging.WARNING, logger="outbox"):
        witness_commit(witnesses, Session(), "t1")  # no bind: get_bind raises
    assert witnesses.latest() == {}
    assert "transaction t1 committed" in caplog.text


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() only")
def test_a_child_forked_while_a_thread_records_a_witness_records_its_own() -> None:
    witnesses = CommitWitnesses()
    stop = threading.Event()

    def busy() -> None:  # holds the witnesses' lock most of the time
        n = 0
        while not stop.is_set():
            witnesses.committed(f"sqlite:///db{n % 40}", f"t{n}")
            n += 1

    thread = threading.Thread(target=busy)
    thread.start()
    hung = 0
    try:
        for _ in range(20):
            pid = os.fork()
            if pid == 0:  # the child: one witness, then out (no pytest teardown here)
                witnesses.committed("sqlite:///child", "c")
                os._exit(0 if witnesses.latest()["sqlite:///child"] == "c" else 1)
            deadline = time.monotonic() + 5
            while (done := os.waitpid(pid, os.WNOHANG)) == (0, 0):
                if time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    hung += 1
                    break
                time.sleep(0.01)
            else:
                assert os.waitstatus_to_exitcode(done[1]) == 0
    finally:
        stop.set()
        thread.join()
    assert hung == 0, f"{hung} of 20 children hung on the lock the parent's thread held"

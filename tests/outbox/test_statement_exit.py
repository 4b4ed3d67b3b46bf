"""How a left statement is told apart from a running one (``outbox.left_scopes``), on a stand-in
scope with the same exits as ``TransactionScope``: no broker, no database.

The token is the bound exit a ``with`` statement looks up as it begins and holds until it calls
it. It must be alive for exactly as long as the body runs, whatever the caller keeps afterwards,
and the scope must stand in for it when no statement made one.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import sys
import weakref
from collections.abc import Iterator
from types import FrameType, TracebackType
from typing import Any

import pytest

from outbox.left_scopes import (
    Statement,
    StatementExit,
    abandoned,
    end_left,
    opened_by,
    statement_of,
)


class Interrupted(BaseException):
    pass


class Scope:
    """The exits of ``TransactionScope``, recording the statement each entry was made by."""

    def __init__(self) -> None:
        self.looked_up: weakref.ref[Any] | None = None
        self.statement: Statement | None = None
        self.exited = 0

    def __enter__(self) -> Scope:
        self.statement = statement_of(self)
        return self

    async def __aenter__(self) -> Scope:
        return self.__enter__()

    def _exit(self, *exc: Any) -> None:
        self.exited += 1

    async def _aexit(self, *exc: Any) -> None:
        self.exited += 1

    __exit__ = StatementExit(_exit)
    __aexit__ = StatementExit(_aexit)

    def alive(self) -> bool:
        assert self.statement is not None
        return self.statement.alive() is not None


def interrupt_next_call() -> None:
    """Raise at the start of the next Python function called, as a signal handler would."""

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            sys.setprofile(None)
            raise Interrupted(frame.f_code.co_qualname)

    sys.setprofile(profile)


def holds(tb: TracebackType | None, scope: Scope) -> bool:
    while tb is not None:
        if tb.tb_frame.f_locals.get("self") is scope:
            return True
        tb = tb.tb_next
    return False


def test_a_statement_is_alive_in_its_body_and_not_after() -> None:
    scope = Scope()
    with scope:
        assert scope.alive()
        with Scope() as inner:
            assert scope.alive() and inner.alive(), "an outer statement is alive in an inner one"
        assert not inner.alive()
    assert scope.exited == 1 and not scope.alive()


def test_a_statement_left_at_its_exit_is_dead_with_its_exception_kept() -> None:
    scope = Scope()
    kept: list[Interrupted] = []
    try:
        with scope:
            interrupt_next_call()
    except Interrupted as err:
        kept.append(err)
    assert str(kept[0]) == "Scope._exit", "interrupted at the start of the exit"
    assert holds(kept[0].__traceback__, scope), "the kept traceback holds the scope"
    assert scope.exited == 0
    assert not scope.alive()


def test_an_async_statement_is_alive_in_its_body_and_dead_once_left_at_its_exit() -> None:
    scope = Scope()
    kept: list[Interrupted] = []

    async def run() -> None:
        async with Scope() as normal:
            assert normal.alive()
        assert normal.exited == 1 and not normal.alive()
        try:
            async with scope:
                assert scope.alive()
                await asyncio.sleep(0)  # suspended in the body: the task's frame holds it
                assert scope.alive()
                interrupt_next_call()
        except Interrupted as err:
            kept.append(err)

    asyncio.run(run())
    assert str(kept[0]) == "Scope._aexit"
    assert holds(kept[0].__traceback__, scope)
    assert scope.exited == 0
    assert not scope.alive()


def test_a_lookup_in_the_body_does_not_replace_the_statement() -> None:
    scope = Scope()
    with scope:
        assert callable(scope.__exit__)  # looked up and dropped at once
        assert hasattr(scope, "__exit__")
        assert scope.alive()


@pytest.mark.parametrize("looked_up_before", [False, True])
def test_a_scope_entered_without_a_statement_stands_in_for_it(looked_up_before: bool) -> None:
    """``__enter__`` called directly (a lookup before it, by ``hasattr``, held by no one)."""
    scope = Scope()
    if looked_up_before:
        assert hasattr(scope, "__exit__")
    scope.__enter__()
    assert scope.alive()
    assert scope.statement is not None
    alive = scope.statement.alive
    del scope
    assert alive() is None, "the scope dropped, the statement is gone"


def test_an_exit_stack_enters_and_exits_the_scope_by_its_type() -> None:
    """``ExitStack`` looks the exits up on the type: no token, the scope stands in."""
    scope = Scope()
    with contextlib.ExitStack() as stack:
        stack.enter_context(scope)
        assert scope.alive()
    assert scope.exited == 1

    async def run() -> None:
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(scope)
            assert scope.alive()

    scope = Scope()
    asyncio.run(run())
    assert scope.exited == 1
    assert Scope.__exit__ is Scope.__dict__["__exit__"], "the type gets the descriptor"


def test_a_forked_child_leaves_the_parents_left_transactions_to_the_parent() -> None:
    """A child forked while a statement lay left inherits it, with its thread's ident and its
    connection: ending it there would roll back over the parent's connection."""
    ended: list[int] = []

    def steps() -> Iterator[None]:
        try:
            yield
        finally:
            ended.append(os.getpid())

    class Txn:
        txn_id = "t"

    def leave() -> tuple[Txn, Iterator[None]]:
        txn, generator = Txn(), steps()
        next(generator)  # at its yield, as a scope's steps wait for the statement's body
        statement = Statement(weakref.ref(Scope()))  # a statement already gone
        statement.generator = weakref.ref(generator)
        opened_by(txn, statement)
        assert abandoned(txn)
        return txn, generator

    txn, generator = leave()
    pid = os.fork()
    if pid == 0:  # the child: tries to end it, then exits without the parent's clean-up
        code = 2
        try:
            end_left(txn)
            code = 1 if ended else 0
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0, "the child ended the parent's transaction"
    end_left(txn)  # the parent's own
    assert ended == [os.getpid()]
    assert inspect.getgeneratorstate(generator) == inspect.GEN_CLOSED

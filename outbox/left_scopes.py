"""A scope left without its exit: never joined, and ended by the next transaction.

A signal handler's exception (Ctrl-C, a worker's timeout, a task's time limit) can be raised at
the very start of a ``with`` or ``async with`` statement's exit, before any of the scope's code
runs. The statement is then left with its transaction unended and still current in the caller's
context. A later transaction there would join it, return as if committed, and never be; and the
left one would hold its session, its connection and its locks (SQLite's write lock, the rows
PostgreSQL locked) until its generator is finalised.

**How a left statement is known.** By a token only the statement holds. The scope's
``__exit__``/``__aexit__`` are :class:`StatementExit` descriptors: a ``with`` statement looks its
exit up as it begins (before ``__enter__``) and keeps what it got on its frame's stack until it
calls it, so the bound exit made there lives exactly as long as the statement's body runs. The
scope itself is no such token: a caller keeping the exception (a task queue keeps a failed
task's) keeps the exit's frame in its traceback, and with it the scope. In asyncio the token
dies as the exit's coroutine is made, just before that coroutine runs. A scope entered without
the statement (``__enter__`` called directly; an ``ExitStack``, which looks the exit up on the
type) has no token, and the scope stands in for it.

**What happens to a left transaction.** It is never joined (:func:`abandoned`), and the next
transaction opened in its thread (its event loop) of its process ends it (:func:`end_left`,
:func:`end_left_async`): its generator, still waiting at its ``yield``, is closed as
finalisation would close it, so the database transaction rolls back, the ROLLBACK op is written
and the session is closed, before the next one begins.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import os
import threading
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar, overload

from outbox.logs import fields

log = logging.getLogger("outbox")

R = TypeVar("R")


class Statement:
    """What a transaction knows of the statement that opened it, all weakly: whether it still
    runs (``alive``), the generator its steps run in, and the process, thread or event loop it
    runs in. (A forked child inherits the parent's left statements, with their thread's
    ident and their connections: those are the parent's to end.)"""

    __slots__ = ("alive", "generator", "loop", "pid", "thread")

    def __init__(self, alive: weakref.ref[Any]) -> None:
        self.alive = alive
        self.generator: weakref.ref[Any] | None = None
        self.pid = os.getpid()
        self.thread = threading.get_ident()
        self.loop: weakref.ref[asyncio.AbstractEventLoop] | None = None


class Exits(Protocol):
    """A scope whose exit is a :class:`StatementExit`: the bound exit last looked up."""

    looked_up: weakref.ref[Any] | None


class StatementExit(Generic[R]):
    """A scope's ``__exit__`` or ``__aexit__``, bound anew at each lookup so that the binding a
    ``with`` statement holds is its liveness token (see the module's docstring)."""

    def __init__(self, exit: Callable[[Any, type[BaseException] | None, Any, Any], R]) -> None:
        self.exit = exit
        self.__doc__ = exit.__doc__

    @overload
    def __get__(self, scope: None, owner: type[Any] | None = None) -> StatementExit[R]: ...

    @overload
    def __get__(
        self, scope: Exits, owner: type[Any] | None = None
    ) -> Callable[[type[BaseException] | None, BaseException | None, TracebackType | None], R]: ...

    def __get__(self, scope: Exits | None, owner: type[Any] | None = None) -> Any:
        if scope is None:
            return self
        bound = functools.partial(self.exit, scope)
        scope.looked_up = weakref.ref(bound)
        return bound

    def __call__(
        self,
        scope: Exits,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> R:
        """Looked up on the type (``ExitStack``, ``AsyncExitStack``): no token was made."""
        return self.exit(scope, exc_type, exc, tb)


def statement_of(scope: Exits) -> Statement:
    """The statement entering ``scope`` now: the exit it looked up if that is still held (it is
    while a ``with`` statement enters), else the scope itself."""
    ref = scope.looked_up
    return Statement(ref if ref is not None and ref() is not None else weakref.ref(scope))


#: The statement each transaction was opened by.
_statements: weakref.WeakKeyDictionary[Any, Statement] = weakref.WeakKeyDictionary()


def opened_by(txn: object, statement: Statement) -> None:
    """Record that ``txn`` was opened by ``statement`` (see :func:`abandoned`)."""
    _statements[txn] = statement


def abandoned(txn: object) -> bool:
    """Whether the statement that opened ``txn`` has been left without ending it."""
    statement = _statements.get(txn)
    return statement is not None and statement.alive() is None


def _left(txn: object) -> tuple[Statement, Any] | None:
    statement = _statements.get(txn) if txn is not None else None
    if statement is None or statement.alive() is not None or statement.generator is None:
        return None
    if statement.pid != os.getpid():
        return None
    generator = statement.generator()
    return None if generator is None else (statement, generator)


def end_left(txn: object) -> None:
    """End ``txn`` if its statement was left in this thread of this process and its generator
    still waits at its ``yield``: one running its exit, or finished, is not touched."""
    left = _left(txn)
    if left is None:
        return
    statement, generator = left
    if statement.thread != threading.get_ident() or not inspect.isgenerator(generator):
        return
    if inspect.getgeneratorstate(generator) != inspect.GEN_SUSPENDED:
        return
    try:
        generator.close()  # as finalisation would: ROLLBACK, the ROLLBACK op, the session closed
    except Exception:
        _log_failed(txn)


async def end_left_async(txn: object) -> None:
    """:func:`end_left` for an ``async with`` statement left on this event loop."""
    left = _left(txn)
    if left is None:
        return
    statement, generator = left
    loop = statement.loop() if statement.loop is not None else None
    if loop is not asyncio.get_running_loop() or not inspect.isasyncgen(generator):
        return
    if generator.ag_running or generator.ag_frame is None:  # running its exit, or finished
        return
    try:
        await generator.aclose()
    except Exception:
        _log_failed(txn)


def _log_failed(txn: object) -> None:
    txn_id = getattr(txn, "txn_id", None)
    log.exception(
        "ending transaction %s, whose statement was left without its exit, failed; the checker "
        "resolves it",
        txn_id,
        extra=fields(txn_id=txn_id),
    )

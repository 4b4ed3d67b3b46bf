"""An exception raised at any point of the outbox's own code never splits "DB change + event".

Python runs a signal handler at set points of whatever code is running, and what the handler
raises comes out there: Ctrl-C's ``KeyboardInterrupt``, the ``SystemExit`` of a gunicorn worker
past its timeout, Celery's soft time limit. The process may live on (a Celery worker takes the
next task). CPython 3.11 runs the handler where a function starts (or a generator resumes
after ``yield``; a coroutine resuming after ``await`` does not check) and where a call into C
returns; a profiler stands in for the signal and raises at the n-th such
point of the outbox's code in one transaction, for every n from the first to the last, in each
public form. Each transaction then ends as its user sees it: its order row in the database
exactly when a ``read_committed`` consumer of the real topic gets its message, once; every half
record sent gets a terminal decision; the caller gets the exception, not another; and a call
that returned committed (an earlier interrupt left nothing behind for it to join).

Each fails without its fix: without the outcome left UNKNOWN once the COMMIT began, an
interrupt just after the database COMMIT returned wrote a ROLLBACK op (a row, no message);
without the context set up inside the ``try``, an interrupt just after ``current.set()``
left the dead transaction current, and every later transaction of the thread joined it and
returned without committing.

The ``with`` and ``async with`` forms run twice: with each op waited for, and with the op sent one
way (the default), where an interrupt after the COMMIT can land while the op is still in the
client's queue. Both fail without the first fix. ``TransactionalProducer`` and
``AsyncTransactionalProducer`` commit in the listener's own code, outside the outbox's: an
interrupt after that COMMIT leaves no op, and the listener's check must answer it.

The asyncio forms run each call in a task of its own, as a server runs each request, and all
calls in one task, as a worker's loop does; the latter fails without the fix that keeps a later
transaction from joining one whose scope's exit was interrupted before any of its code ran
(``outbox.left_scopes``): the next call returned without committing.

``with``, and ``async with`` in one task, also run keeping every exception until the last call
has returned, as a task queue keeps a failed task's. A kept traceback keeps a scope left at its
exit alive, with its session and locks: the next call must end that transaction, neither join it
nor wait on its locks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import dis
import functools
import gc
import os
import sys
import threading
import traceback
import uuid
import weakref
from collections.abc import Callable, Coroutine, Iterator
from types import CodeType, FrameType
from typing import Any, ClassVar, NamedTuple

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

import outbox
from outbox import (
    AsyncTransactionalProducer,
    LocalTransactionState,
    Message,
    OutboxProducer,
    OutboxSettings,
    TransactionalProducer,
)
from outbox.checks.executing import ExecutingMarks
from outbox.held_connections import held_connections
from tests.checker.test_checker import SECRET
from tests.outbox.test_asyncio import async_factory
from tests.pipeline import Pipeline, pipeline
from tests.producer_fixtures import Topics, order_ids, orders

pytestmark = [pytest.mark.integration, pytest.mark.scale]

OUTBOX = os.path.dirname(outbox.__file__) + os.sep
TESTING = os.path.join(OUTBOX, "testing") + os.sep


class Interrupted(BaseException):
    """What the asyncio form is interrupted with: a task that raises ``KeyboardInterrupt``
    takes its event loop down with it, while this one reaches the awaiting caller alone."""


class Interrupt:
    """A profiler raising ``exc`` at the ``at``-th point in the outbox's code where CPython
    runs a signal handler: a function's start or a generator's resumption after ``yield``, and
    the return of each call into C (the profiler's ``call`` and ``c_return`` events, less a
    coroutine's resumption after ``await``). With ``at`` None it counts them. In an event loop,
    only ``task``'s points count."""

    def __init__(self, at: int | None, exc: type[BaseException]) -> None:
        self.at, self.exc = at, exc
        self.task: asyncio.Task[Any] | None = None
        self.points = 0
        self.where: str | None = None
        self.stack = ""  # where it raised, in full: what a caller it did not reach was doing

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event not in ("call", "c_return") or self.where is not None:
            return
        if event == "call" and not checks_signals(frame):
            return
        name = frame.f_code.co_filename
        if not name.startswith(OUTBOX) or name.startswith(TESTING):
            return
        if Collector.running_here() or in_finalizer(frame):
            return
        if self.task is not None and asyncio.current_task() is not self.task:
            return  # another task's, or a callback's: the loop's, not this transaction's
        self.points += 1
        if self.points == self.at:
            self.where = f"{name[len(OUTBOX) :]}:{frame.f_lineno}"
            if event == "c_return":
                self.where += f" after {getattr(arg, '__qualname__', arg)}()"
            self.stack = "".join(traceback.format_stack(frame))
            raise self.exc(self.where)


class Collector:
    """The thread the cyclic garbage collector runs in now (None: it does not run). What it
    finalises - a generator or coroutine it closes, a ``__del__``, a weakref's callback - runs
    at whatever allocation in that thread started it, and an exception raised there never
    reaches the caller: CPython prints "Exception ignored in ..." and goes on. No point the
    caller can be interrupted at."""

    thread: ClassVar[int | None] = None

    @classmethod
    def note(cls, phase: str, info: dict[str, int]) -> None:
        """A ``gc.callbacks`` entry: collections never nest, so one slot says it all."""
        cls.thread = threading.get_ident() if phase == "start" else None

    @classmethod
    def running_here(cls) -> bool:
        """Whether this thread is collecting. Per thread: another thread's collection gives
        up the GIL while what it finalises waits on I/O, and the traced thread then runs
        points of its own, which count."""
        return cls.thread == threading.get_ident()


# Registered for the whole session (harmless: it only sets a slot), never added and removed
# around a call, which could leave the slot set if removed during another thread's collection.
gc.callbacks.append(Collector.note)


#: ``weakref.finalize``'s own code: what runs a finalizer when its object goes.
FINALIZE = os.path.abspath(weakref.__file__)


def in_finalizer(frame: FrameType | None) -> bool:
    """Whether ``frame`` runs inside a finalizer (a ``__del__``, a ``weakref.finalize``
    callback), started by the garbage collector at whatever line dropped the last reference. A
    signal handler raising there does not reach the caller: CPython prints "Exception ignored
    in ..." and goes on. Not a point the caller can be interrupted at (counted, it left the
    caller with no exception at all, now and then: a mark's folder finalized mid-transaction)."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__del__" or (
            code.co_name == "__call__" and os.path.abspath(code.co_filename) == FINALIZE
        ):
            return True
        frame = frame.f_back
    return False


#: CPython 3.11's RESUME runs pending signal handlers only at a function's start (oparg 0) and
#: after a plain ``yield`` (1), not after ``yield from`` (2) or ``await`` (3): ``oparg < 2`` in
#: ceval.c. A generator resumed by ``throw()`` (how asyncio hands a coroutine the exception its
#: awaited future ended with) skips RESUME altogether.
RESUME = dis.opmap["RESUME"]


@functools.cache
def _first_resume(code: CodeType) -> int:
    return next(i for i in range(0, len(code.co_code), 2) if code.co_code[i] == RESUME)


def checks_signals(frame: FrameType) -> bool:
    """Whether a ``call`` event is where CPython runs a signal handler: a function's start, or a
    generator going on after ``yield``; not a coroutine going on after ``await``, or one resumed
    by ``throw()``. (Raised there, an exception would leave the awaited coroutine suspended
    mid-way, or replace the exception being thrown in: states no signal brings about, which a
    first version of this test reported.)"""
    code, at = frame.f_code.co_code, frame.f_lasti
    if code[at] == RESUME:
        return code[at + 1] < 2
    return at < _first_resume(frame.f_code)  # the prologue, before the function's first RESUME


class Reached(NamedTuple):
    """What one interrupted call met: where the interrupt was raised (None: the call passed
    fewer points), what the caller got (None: it returned), and the stack it was raised in."""

    where: str | None
    raised: type[BaseException] | None
    stack: str = ""


Met = dict[str, Reached]


def traced(
    tracer: Interrupt, run: Callable[[], Any], kept: list[BaseException] | None = None
) -> type[BaseException] | None:
    """What ``run()`` raised under ``tracer`` (None: it returned). Its type only, unless
    ``kept`` is given: the error keeps the frames it passed alive, with what they hold (a scope
    left at its exit, its session and connection), as a task queue keeping a failed task's
    exception does."""
    sys.setprofile(tracer)
    try:
        run()
    except BaseException as err:
        if kept is not None:
            kept.append(err)
        return type(err)
    finally:
        sys.setprofile(None)
    return None


async def traced_async(
    tracer: Interrupt,
    run: Callable[[], Coroutine[Any, Any, None]],
    kept: list[BaseException] | None = None,
) -> type[BaseException] | None:
    """What ``await run()`` raised under ``tracer`` (:func:`traced`), run in a task of its own
    as a server runs each request: with its own copy of the context."""

    return await asyncio.create_task(traced_in_this_task(tracer, run, kept))


async def traced_in_this_task(
    tracer: Interrupt,
    run: Callable[[], Coroutine[Any, Any, None]],
    kept: list[BaseException] | None = None,
) -> type[BaseException] | None:
    """What ``await run()`` raised under ``tracer``, counting this task's points only."""
    tracer.task = asyncio.current_task()
    sys.setprofile(tracer)
    try:
        await run()
    except BaseException as err:
        if kept is not None:
            kept.append(err)
        return type(err)
    finally:
        sys.setprofile(None)
    return None


class OrdersListener:
    """A RocketMQ-style listener whose local transaction inserts the message's order."""

    def __init__(self, factory: sessionmaker) -> None:
        self.factory = factory

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        with self.factory.begin() as session:
            session.execute(orders.insert().values(id=arg, amount=1))
        return LocalTransactionState.COMMIT

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        with self.factory() as session:
            found = session.scalar(sa.select(orders.c.id).filter_by(id=msg.value.decode()))
        return LocalTransactionState.COMMIT if found else LocalTransactionState.ROLLBACK


def sync_forms(
    producer: OutboxProducer, factory: sessionmaker, topic: str
) -> dict[str, Callable[[str], None]]:
    """Each synchronous form placing one order: its row and its message."""

    def in_context(order: str) -> None:
        with producer.transaction(factory) as txn:
            txn.send(topic, order, key=order)
            assert txn.session is not None
            txn.session.execute(orders.insert().values(id=order, amount=1))

    @outbox.transactional(producer=producer, session_factory=factory)
    def decorated(order: str, *, session: Session) -> None:
        outbox.send(topic, order, key=order)
        session.execute(orders.insert().values(id=order, amount=1))

    sender = TransactionalProducer(producer, OrdersListener(factory))

    def rocketmq(order: str) -> None:
        sender.send_message_in_transaction(Message(topic, order.encode(), key=order), order)

    return {"with": in_context, "decorator": decorated, "TransactionalProducer": rocketmq}


class AsyncOrdersListener:
    """:class:`OrdersListener` for asyncio: the local transaction awaited on the loop. Its check
    is a plain function, as the checker may ask once the test's event loop is gone."""

    def __init__(
        self, factory: async_sessionmaker[AsyncSession], sync_factory: sessionmaker
    ) -> None:
        self.factory = factory
        self.checks = OrdersListener(sync_factory)

    async def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        async with self.factory.begin() as session:
            await session.execute(orders.insert().values(id=arg, amount=1))
        return LocalTransactionState.COMMIT

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        return self.checks.check_local_transaction(msg)


def async_forms(
    producer: OutboxProducer,
    factory: async_sessionmaker[AsyncSession],
    sync_factory: sessionmaker,
    topic: str,
) -> dict[str, Callable[[str], Coroutine[Any, Any, None]]]:
    """Each asyncio form placing one order: its row and its message."""

    async def in_async_context(order: str) -> None:
        async with producer.transaction(factory) as txn:
            await txn.send(topic, order, key=order)
            assert txn.session is not None
            await txn.session.execute(orders.insert().values(id=order, amount=1))

    @outbox.transactional(producer=producer, session_factory=factory)
    async def decorated(order: str, *, session: AsyncSession) -> None:
        await outbox.send(topic, order, key=order)
        await session.execute(orders.insert().values(id=order, amount=1))

    sender = AsyncTransactionalProducer(producer, AsyncOrdersListener(factory, sync_factory))

    async def rocketmq(order: str) -> None:
        await sender.send_message_in_transaction(Message(topic, order.encode(), key=order), order)

    return {
        "async with": in_async_context,
        "async decorator": decorated,
        "AsyncTransactionalProducer": rocketmq,
    }


def interrupt_every_point(
    place: Callable[[str], None], exc: type[BaseException], *, keep: bool = False
) -> Met:
    """``place`` run once per point it passes, interrupted there: what each order met. With
    ``keep``, every exception is kept until the last call has returned."""
    counting = Interrupt(None, exc)
    assert traced(counting, lambda: place(f"count-{uuid.uuid4().hex[:8]}")) is None
    met: Met = {}
    kept: list[BaseException] | None = [] if keep else None
    for at in range(1, counting.points + 2):  # and one past the last: not interrupted
        order = f"at{at}-{uuid.uuid4().hex[:8]}"
        tracer = Interrupt(at, exc)
        raised = traced(tracer, functools.partial(place, order), kept)
        met[order] = Reached(tracer.where, raised, tracer.stack)
    return met


async def interrupt_every_point_async(
    place: Callable[[str], Coroutine[Any, Any, None]],
    exc: type[BaseException],
    *,
    one_task: bool = False,
    keep: bool = False,
) -> Met:
    """:func:`interrupt_every_point` in asyncio: each call in a task of its own, as a server
    runs each request, or (``one_task``) all in this task, as a worker's loop takes one job
    after another in the context the last one left."""
    traced_here = traced_in_this_task if one_task else traced_async
    counting = Interrupt(None, exc)
    assert await traced_here(counting, lambda: place(f"count-{uuid.uuid4().hex[:8]}")) is None
    met: Met = {}
    kept: list[BaseException] | None = [] if keep else None
    for at in range(1, counting.points + 2):
        order = f"at{at}-{uuid.uuid4().hex[:8]}"
        tracer = Interrupt(at, exc)
        raised = await traced_here(tracer, functools.partial(place, order), kept)
        met[order] = Reached(tracer.where, raised, tracer.stack)
    return met


def assert_rows_and_messages_agree(
    running: Pipeline,
    engine: sa.Engine,
    topics: Topics,
    met: Met,
    exc: type[BaseException],
) -> None:
    odd = {o: m for o, m in met.items() if m.raised is not (exc if m.where else None)}
    assert odd == {}, "the caller gets the interrupt (or nothing, when it was not reached):\n" + (
        "\n".join(f"{o} got {m.raised}, raised at {m.where} in\n{m.stack}" for o, m in odd.items())
    )
    # every half record sent is decided in the end: by its op, or by the checker
    txn_ids = {h.txn_id for h in topics.halves() if h.message.key and h.message.key.decode() in met}
    running.decided(txn_ids, timeout=180)
    rows = set(order_ids(engine)) & set(met)
    delivered = running.settle(lambda: rows, timeout=120)
    split = {
        o: (met[o].where, o in rows, delivered[o])
        for o in met
        if (o in rows) != (o in delivered) or delivered[o] > 1
    }
    assert split == {}, "order: (interrupted at, row committed, times delivered)"
    # and a call that returned committed: the interrupts before it left nothing behind
    assert {o for o, m in met.items() if m.raised is None} <= rows


@pytest.fixture
def one_way_producer(outbox_settings: OutboxSettings) -> Iterator[OutboxProducer]:
    """The default op path: the op record is handed to the client and not waited for."""
    with OutboxProducer(dataclasses.replace(outbox_settings, wait_for_op=False)) as p:
        yield p


@pytest.fixture
def any_op_producer(request: pytest.FixtureRequest) -> OutboxProducer:
    """The producer a test names by indirect parametrisation: ``op-acknowledged``, each
    transaction's op waited for (what the other tests use), or ``op-one-way``, sent one way (the
    default): an interrupt after the COMMIT may then land while the op is still in the client's
    queue, and the checker, not the op, decides."""
    name = "producer" if request.param == "op-acknowledged" else "one_way_producer"
    found: OutboxProducer = request.getfixturevalue(name)
    return found


def test_the_harness_counts_no_point_in_a_finalizer(tmp_path: Any) -> None:
    """A finalizer of the outbox's own (a producer's executing marks, removing their folder)
    runs wherever the last reference goes: an interrupt raised in it never reaches the caller,
    so it is no point to test."""
    marks = [ExecutingMarks(str(tmp_path / f"marks-{n}")) for n in range(2)]

    counting = Interrupt(None, KeyboardInterrupt)
    assert traced(counting, marks.pop) is None  # the popped marks go, their finalizer runs
    assert counting.points == 0, "points counted in the finalizer"
    interrupted = Interrupt(1, KeyboardInterrupt)
    assert traced(interrupted, marks.pop) is None
    assert interrupted.where is None
    # the same code called by the outbox itself (closing a producer) is counted
    marks.append(ExecutingMarks(str(tmp_path / "marks-removed")))
    removing = Interrupt(None, KeyboardInterrupt)
    assert traced(removing, marks[0].remove) is None
    assert removing.points > 0


def test_the_harness_counts_no_point_in_what_the_collector_runs() -> None:
    """The cyclic garbage collector closes a generator it finds unreachable at whatever
    allocation started it: its ``finally`` runs the outbox's code there (a left scope's exit, as
    a transaction whose exception a caller kept and then dropped is finalised in a later
    transaction of another test), and an interrupt raised in it never reaches the caller
    ("Exception ignored in: <generator ...>"). Counted, one such point left an asyncio call
    returning with nothing raised, once in CI."""

    class Holder:
        generator: Iterator[None]

    closed: list[bool] = []

    def left(holder: Holder) -> Iterator[None]:  # its frame holds what holds it: a cycle
        try:
            yield
        finally:
            list(held_connections(None))  # the outbox's code, run as it is closed
            closed.append(sys.getprofile() is counting)  # closed under the traced collection

    counting = Interrupt(None, KeyboardInterrupt)
    gc.disable()  # no collection before the traced one
    try:
        holder = Holder()
        holder.generator = left(holder)
        next(holder.generator)
        del holder
        assert traced(counting, gc.collect) is None  # the generator goes, its finally runs
    finally:
        gc.enable()
    assert closed == [True], "the generator was not closed by the traced collection"
    assert counting.points == 0, "points counted in what the collector ran"
    after = Interrupt(1, KeyboardInterrupt)
    assert traced(after, lambda: list(held_connections(None))) is KeyboardInterrupt


@pytest.mark.parametrize(
    ("form", "any_op_producer", "errors"),
    [
        ("with", "op-acknowledged", "dropped"),
        ("with", "op-one-way", "dropped"),
        ("decorator", "op-acknowledged", "dropped"),
        ("TransactionalProducer", "op-acknowledged", "dropped"),
        ("with", "op-acknowledged", "kept"),
        ("decorator", "op-acknowledged", "kept"),
    ],
    indirect=["any_op_producer"],
)
def test_an_interrupt_at_any_point_of_a_sync_transaction_never_splits_row_and_message(
    kafka_bootstrap: str,
    any_op_producer: OutboxProducer,
    session_factory: sessionmaker,
    engine: sa.Engine,
    topics: Topics,
    form: str,
    errors: str,
) -> None:
    producer = any_op_producer
    producer.serve_checks(engine=engine, secret=SECRET)
    with pipeline(kafka_bootstrap, topics) as running:
        place = sync_forms(producer, session_factory, running.topic)[form]
        place(f"warm-{uuid.uuid4().hex[:8]}")
        met = interrupt_every_point(place, KeyboardInterrupt, keep=errors == "kept")
        assert_rows_and_messages_agree(running, engine, topics, met, KeyboardInterrupt)


@pytest.mark.parametrize(
    ("form", "any_op_producer", "tasks"),
    [
        ("async with", "op-acknowledged", "task-per-call"),
        ("async with", "op-one-way", "task-per-call"),
        ("AsyncTransactionalProducer", "op-acknowledged", "task-per-call"),
        ("async with", "op-acknowledged", "one-task"),
        ("AsyncTransactionalProducer", "op-acknowledged", "one-task"),
        ("async with", "op-acknowledged", "one-task-errors-kept"),
        ("async decorator", "op-acknowledged", "task-per-call"),
        ("async decorator", "op-acknowledged", "one-task-errors-kept"),
    ],
    indirect=["any_op_producer"],
)
def test_an_interrupt_at_any_point_of_an_asyncio_transaction_never_splits_row_and_message(
    kafka_bootstrap: str,
    any_op_producer: OutboxProducer,
    session_factory: sessionmaker,
    engine: sa.Engine,
    db_url: str,
    topics: Topics,
    form: str,
    tasks: str,
) -> None:
    producer = any_op_producer
    producer.serve_checks(engine=engine, secret=SECRET)
    loop_errors: list[str] = []

    async def run(topic: str) -> Met:
        asyncio.get_running_loop().set_exception_handler(
            lambda _, context: loop_errors.append(repr(context.get("exception")))
        )
        async with async_factory(db_url) as factory:
            place = async_forms(producer, factory, session_factory, topic)[form]
            await place(f"warm-{uuid.uuid4().hex[:8]}")
            met = await interrupt_every_point_async(
                place,
                Interrupted,
                one_task=tasks.startswith("one-task"),
                keep=tasks.endswith("errors-kept"),
            )
            await asyncio.sleep(0.1)  # the loop finalises what an interrupt left behind
            return met

    with pipeline(kafka_bootstrap, topics) as running:
        met = asyncio.run(run(running.topic))
        assert_rows_and_messages_agree(running, engine, topics, met, Interrupted)
        assert loop_errors == [], "nothing an interrupt left behind fails unseen"

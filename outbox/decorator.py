"""``@outbox.transactional``: the decorator form of a transaction.

::

    outbox.configure(producer=OutboxProducer(settings), session_factory=Session)

    @outbox.transactional
    def place_order(order_id: str, *, session: Session) -> None:
        session.add(Order(id=order_id))
        outbox.send("orders", f'{{"id": "{order_id}"}}', key=order_id)

An ``async def`` runs as an asyncio transaction, on an ``AsyncSession`` (the factory an
``async_sessionmaker``)::

    @outbox.transactional(producer=producer, session_factory=AsyncSessionFactory)
    async def place_order(order_id: str, *, session: AsyncSession) -> None:
        session.add(Order(id=order_id))
        await outbox.send("orders", f'{{"id": "{order_id}"}}', key=order_id)

A function with a ``session`` parameter gets the transaction's session when the caller passes
none; a session the caller passes (by keyword or position) becomes the transaction's session, so
the function's writes, the evidence row and the commit stay one database transaction. Calls
nested inside a running transaction join it (with its session, or none).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar, overload

from outbox.errors import ConfigurationError, WrongFormError
from outbox.nesting import SessionSource, is_async_session, is_sync_session, resolved
from outbox.producer import AsyncSessionSource, OutboxProducer

log = logging.getLogger("outbox")

P = ParamSpec("P")
R = TypeVar("R")

_OPTIONS = ("producer", "session_factory")


class _Injected:
    def __repr__(self) -> str:
        return "outbox.INJECTED"


#: The default of a ``@transactional`` function's ``session`` parameter: the decorator passes
#: the transaction's session in its place, and a caller that passes none type-checks
#: (``async def place(order_id: str, session: AsyncSession = outbox.INJECTED)``).
INJECTED: Any = _Injected()


@dataclass
class _Defaults:
    producer: OutboxProducer | None = None
    session_factory: SessionSource | AsyncSessionSource | None = None


_defaults = _Defaults()


def configure(
    *,
    producer: OutboxProducer | None = None,
    session_factory: SessionSource | AsyncSessionSource | None = None,
) -> None:
    """Set the producer and session factory that bare ``@transactional`` functions use (a
    ``sessionmaker`` for ``def`` functions, an ``async_sessionmaker`` for ``async def`` ones)."""
    if producer is not None:
        _check_producer(producer)
        _defaults.producer = producer
    if session_factory is not None:
        _check_session_factory(session_factory)
        _defaults.session_factory = session_factory


@overload
def transactional(fn: Callable[P, R], /) -> Callable[P, R]: ...
@overload
def transactional(
    *,
    producer: OutboxProducer | None = None,
    session_factory: SessionSource | AsyncSessionSource | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...
def transactional(fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """Run the function as one local transaction whose messages are delivered iff it commits.

    Usable bare (``@transactional``, with the defaults from :func:`configure`) or with
    keyword-only options ``producer=`` and ``session_factory=``, checked at decoration time.
    An ``async def`` function is an asyncio transaction on an ``AsyncSession``: its wrapper is
    a coroutine function too, and ``outbox.send()`` inside it is awaited.

    Raises:
        ConfigurationError: an unknown option, or none configured when the function runs.
    """
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise ConfigurationError(
            f"the following options of @transactional are undefined: {', '.join(unknown)}; "
            f"the options are: {', '.join(_OPTIONS)}"
        )
    if options.get("producer") is not None:
        _check_producer(options["producer"])
    if options.get("session_factory") is not None:
        _check_session_factory(options["session_factory"])
    if fn is None:
        return lambda f: _wrap(f, options)
    if not callable(fn):
        raise ConfigurationError(f"@transactional decorates functions, not {fn!r}")
    return _wrap(fn, options)


def _wrap(fn: Callable[P, R], options: dict[str, Any]) -> Callable[P, R]:
    _refuse_deferred(fn)
    parameters = inspect.signature(fn).parameters
    takes_session = "session" in parameters
    position = _position(parameters, "session")
    positional_only = (
        takes_session and parameters["session"].kind is inspect.Parameter.POSITIONAL_ONLY
    )
    asynchronous = inspect.iscoroutinefunction(fn)

    def source(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[OutboxProducer, Any, Any]:
        producer = options.get("producer") or _defaults.producer
        factory = options.get("session_factory") or _defaults.session_factory
        # A session the caller passes is the transaction's: the outbox's evidence row and
        # commit must be in the same database transaction as the function's writes.
        given = _given_session(args, kwargs, position) if takes_session else None
        if producer is None or (factory is None and given is None):
            raise ConfigurationError(
                f"{fn.__qualname__} is @transactional but no producer/session factory is set; "
                "call outbox.configure(producer=..., session_factory=...) at start-up or pass "
                "them as options of the decorator"
            )
        session = resolved(given if given is not None else factory)  # scoped: its session
        _check_form(fn, session, asynchronous)
        return producer, session, given

    if asynchronous:
        call: Callable[..., Coroutine[Any, Any, Any]] = fn  # type: ignore[assignment]

        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            producer, session, given = source(args, kwargs)
            async with producer.transaction(session) as txn:
                if takes_session and given is None:
                    args = _inject(
                        args, kwargs, position, txn.session, positional_only=positional_only
                    )
                result = await call(*args, **kwargs)
                if result is not None and _is_generator(result):
                    _discard(result)
                    raise WrongFormError(_generator_message(fn, result))
                return result

        return run_async  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        producer, session, given = source(args, kwargs)
        with producer.transaction(session) as txn:
            if takes_session and given is None:
                args = _inject(args, kwargs, position, txn.session, positional_only=positional_only)  # type: ignore[assignment]
            result = fn(*args, **kwargs)
            if result is not None:  # None: the common case, spared the checks below
                if _is_generator(result):
                    _discard(result)
                    raise WrongFormError(_generator_message(fn, result))
                if inspect.isawaitable(result):
                    _discard(result)
                    raise WrongFormError(_deferred_message(fn, "returned an awaitable"))
            return result

    return wrapper


def _inject(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    position: int | None,
    session: Any,
    *,
    positional_only: bool = False,
) -> tuple[Any, ...]:
    """Put the transaction's session where the caller passed none (or ``INJECTED``)."""
    if position is not None and len(args) > position:  # INJECTED passed by position
        return (*args[:position], session, *args[position + 1 :])
    if positional_only and len(args) == position:
        return (*args, session)  # a positional-only parameter cannot take a keyword
    kwargs["session"] = session
    return args


def _check_form(fn: Callable[..., Any], session: object, asynchronous: bool) -> None:
    """An ``async def`` needs an AsyncSession (factory), a ``def`` a Session (factory).

    Raises:
        WrongFormError: naming the form that fits.
    """
    if asynchronous and is_sync_session(session):
        raise WrongFormError(
            f"{_name(fn)} is an async def, but its session is a synchronous "
            f"{type(session).__qualname__}; give it an AsyncSession or async_sessionmaker "
            "(sqlalchemy.ext.asyncio), or make the function a plain def"
        )
    if not asynchronous and is_async_session(session):
        raise WrongFormError(
            f"{_name(fn)} is a plain def, but its session is an asyncio "
            f"{type(session).__qualname__}; make the function `async def` (and `await "
            "outbox.send(...)`), or give it a Session or sessionmaker"
        )


def _position(parameters: Mapping[str, inspect.Parameter], name: str) -> int | None:
    """The index at which ``name`` can be passed positionally, if it can."""
    for index, parameter in enumerate(parameters.values()):
        if parameter.name == name:
            positional = (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD)
            return index if parameter.kind in positional else None
    return None


def _given_session(args: tuple[Any, ...], kwargs: Mapping[str, Any], position: int | None) -> Any:
    """The ``session`` the caller passed, by keyword or position; None if none."""
    if "session" in kwargs:
        given = kwargs["session"]
    elif position is not None and len(args) > position:
        given = args[position]
    else:
        return None
    return None if given is INJECTED else given


def _refuse_deferred(fn: Callable[..., Any]) -> None:
    """A coroutine or generator function's body runs after the call returns, so after the
    transaction ended: its writes would never commit and its sends would have no transaction.

    Raises:
        ConfigurationError: naming the asyncio way.
    """
    if not inspect.isfunction(fn) and not inspect.ismethod(fn):  # an object: its __call__
        call = inspect.getattr_static(type(fn), "__call__", None)
        if inspect.isasyncgenfunction(call) or inspect.isgeneratorfunction(call):
            fn = call
    if inspect.isasyncgenfunction(fn):
        raise WrongFormError(
            f"@transactional cannot run {_name(fn)}: it is an async generator function, whose "
            "body runs while it is iterated, after the transaction ended; return a list instead"
        )
    if inspect.isgeneratorfunction(fn):
        raise ConfigurationError(
            f"@transactional cannot run {_name(fn)}: it is a generator function, whose body "
            "runs while it is iterated, after the transaction ended; return a list instead"
        )


def _deferred_message(fn: Callable[..., Any], what: str) -> str:
    return (
        f"@transactional cannot run {_name(fn)}: it {what}, whose body would run after the "
        "synchronous database transaction ended - its writes never committed, its messages "
        "sent outside any transaction. Declare it `async def` (the asyncio form, on an "
        "AsyncSession) so the transaction awaits it"
    )


def _is_generator(result: object) -> bool:
    return inspect.isgenerator(result) or inspect.isasyncgen(result)


def _generator_message(fn: Callable[..., Any], result: object) -> str:
    """A callable that returned a generator (a class whose ``__call__`` yields, a function
    returning a generator expression): the decorator could not tell before the call, and the
    generator's body would run while it is iterated, after the transaction ended."""
    kind = "an async generator" if inspect.isasyncgen(result) else "a generator"
    return (
        f"@transactional cannot run {_name(fn)}: it returned {kind}, whose body would run while "
        "it is iterated, after the transaction ended - its writes never committed, its messages "
        "sent outside any transaction; its transaction is rolled back. Return a list instead"
    )


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def _discard(awaitable: object) -> None:
    """Close a coroutine or generator that will never run, so Python does not warn it was
    never awaited. An async generator never iterated needs no closing (its ``aclose()`` is
    itself a coroutine to await)."""
    if inspect.isasyncgen(awaitable):
        return
    close = getattr(awaitable, "close", None)
    if callable(close):
        try:
            close()  # a generator the call started runs its finally blocks here
        except Exception:
            log.exception("closing what %r returned raised; ignored", awaitable)


def _check_producer(producer: object) -> None:
    if not isinstance(producer, OutboxProducer):
        raise ConfigurationError(f"producer must be an OutboxProducer, got {producer!r}")


def _check_session_factory(factory: object) -> None:
    if not callable(factory) and not is_sync_session(factory) and not is_async_session(factory):
        raise ConfigurationError(
            "session_factory must be a sqlalchemy sessionmaker or Session (async_sessionmaker "
            f"or AsyncSession for async def functions), got {factory!r}"
        )

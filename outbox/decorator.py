"""``@outbox.transactional`` and ``outbox.send()``: the decorator form of a transaction.

::

    outbox.configure(producer=OutboxProducer(settings), session_factory=Session)

    @outbox.transactional
    def place_order(order_id: str, *, session: Session) -> None:
        session.add(Order(id=order_id))
        outbox.send("orders", f'{{"id": "{order_id}"}}', key=order_id)

A function with a ``session`` parameter gets the transaction's session when the caller passes
none; a session the caller passes (by keyword or position) becomes the transaction's session, so
the function's writes, the evidence row and the commit stay one database transaction. Calls
nested inside a running transaction join it (with its session, or none).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar, overload

from sqlalchemy.orm import Session

from outbox.errors import ConfigurationError, NoActiveTransactionError
from outbox.message import Headers, Message, Serializer
from outbox.producer import OutboxProducer, SessionSource, current
from outbox.transaction import HalfCoordinates, OutboxTransaction

P = ParamSpec("P")
R = TypeVar("R")

_OPTIONS = ("producer", "session_factory")


@dataclass
class _Defaults:
    producer: OutboxProducer | None = None
    session_factory: SessionSource | None = None


_defaults = _Defaults()


def configure(
    *, producer: OutboxProducer | None = None, session_factory: SessionSource | None = None
) -> None:
    """Set the producer and session factory that bare ``@transactional`` functions use."""
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
    *, producer: OutboxProducer | None = None, session_factory: SessionSource | None = None
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...
def transactional(fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """Run the function as one local transaction whose messages are delivered iff it commits.

    Usable bare (``@transactional``, with the defaults from :func:`configure`) or with
    keyword-only options ``producer=`` and ``session_factory=``, checked at decoration time.

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

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
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
        with producer.transaction(given or factory) as txn:  # type: ignore[arg-type]
            if takes_session and given is None:
                kwargs["session"] = txn.session
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                _discard(result)
                raise ConfigurationError(_deferred_message(fn, "returned an awaitable"))
            return result

    return wrapper


def _position(parameters: Mapping[str, inspect.Parameter], name: str) -> int | None:
    """The index at which ``name`` can be passed positionally, if it can."""
    for index, parameter in enumerate(parameters.values()):
        if parameter.name == name:
            positional = (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD)
            return index if parameter.kind in positional else None
    return None


def _given_session(args: tuple[Any, ...], kwargs: dict[str, Any], position: int | None) -> Any:
    """The ``session`` the caller passed, by keyword or position; None if none."""
    if "session" in kwargs:
        return kwargs["session"]
    if position is not None and len(args) > position:
        return args[position]
    return None


def _refuse_deferred(fn: Callable[..., Any]) -> None:
    """A coroutine or generator function's body runs after the call returns, so after the
    transaction ended: its writes would never commit and its sends would have no transaction.

    Raises:
        ConfigurationError: naming the asyncio way.
    """
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        raise ConfigurationError(_deferred_message(fn, "is a coroutine function (async def)"))
    if inspect.isgeneratorfunction(fn):
        raise ConfigurationError(
            f"@transactional cannot run {_name(fn)}: it is a generator function, whose body "
            "runs while it is iterated, after the transaction ended; return a list instead"
        )


def _deferred_message(fn: Callable[..., Any], what: str) -> str:
    return (
        f"@transactional cannot run {_name(fn)}: it {what}, whose body would run after the "
        "synchronous database transaction ended - its writes never committed, its messages "
        "sent outside any transaction. This version has no asyncio form of the outbox yet: "
        "make the function synchronous (def) and call it from async code with "
        "`await asyncio.to_thread(fn, ...)`"
    )


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def _discard(awaitable: object) -> None:
    """Close a coroutine that will never run, so Python does not warn it was never awaited."""
    close = getattr(awaitable, "close", None)
    if callable(close):
        close()


def send(
    topic: str,
    value: Any,
    key: Any = None,
    headers: Headers | None = None,
    *,
    serializer: Serializer | None = None,
    delay: Any = None,
) -> HalfCoordinates:
    """Send a half message in the current transaction (see :meth:`OutboxTransaction.send`).

    Raises:
        NoActiveTransactionError: called outside ``@transactional`` / ``producer.transaction()``.
    """
    return current_transaction().send(
        topic, value, key, headers, serializer=serializer, delay=delay
    )


def send_batch(
    messages: Iterable[Message], *, serializer: Serializer | None = None
) -> HalfCoordinates:
    """Send several half messages in the current transaction, waiting once for all of them
    (see :meth:`OutboxTransaction.send_batch`).

    Raises:
        NoActiveTransactionError: called outside ``@transactional`` / ``producer.transaction()``.
    """
    return current_transaction().send_batch(messages, serializer=serializer)


def current_transaction() -> OutboxTransaction:
    """The transaction this code runs in.

    Raises:
        NoActiveTransactionError: there is none.
    """
    txn = current.get()
    if txn is None:
        raise NoActiveTransactionError(
            "outbox.send() was called outside a transaction; call it inside a function decorated "
            "with @outbox.transactional or inside `with producer.transaction(...)`"
        )
    return txn


def _check_producer(producer: object) -> None:
    if not isinstance(producer, OutboxProducer):
        raise ConfigurationError(f"producer must be an OutboxProducer, got {producer!r}")


def _check_session_factory(factory: object) -> None:
    if not callable(factory) and not isinstance(factory, Session):
        raise ConfigurationError(
            f"session_factory must be a sqlalchemy sessionmaker or Session, got {factory!r}"
        )

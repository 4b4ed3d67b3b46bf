"""Which transaction an outbox scope runs in, and on which session.

A scope opened inside another of the same form joins it (``current``: the transaction this
thread or task is inside); otherwise it runs a new one on the session it was given, or on one
it makes from a factory (and then closes). A scoped session (:func:`resolved`) is the session
it names, not a factory. Both forms - ``with`` for a ``Session``, ``async
with`` for an ``AsyncSession`` - decide it here, and refuse the other form's sessions naming
the form that fits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from contextvars import ContextVar, Token
from typing import Any, TypeVar

from sqlalchemy.orm import Session, scoped_session, sessionmaker

from outbox.async_transaction import AsyncOutboxTransaction
from outbox.errors import ConfigurationError, WrongFormError
from outbox.left_scopes import abandoned
from outbox.serialization import key_serializer_for
from outbox.transaction import OutboxTransaction, TransactionHost

T = TypeVar("T", OutboxTransaction, AsyncOutboxTransaction)
S = TypeVar("S")

SessionSource = Session | Callable[[], Session]

#: The transaction the current thread or task is inside, for ``outbox.send()`` and nesting.
current: ContextVar[OutboxTransaction | AsyncOutboxTransaction | None] = ContextVar(
    "outbox_transaction", default=None
)


def reset(token: Token[Any]) -> None:
    """``current`` back to what it was before ``token``'s ``set``. A left scope's generator
    (:mod:`outbox.left_scopes`) may be finalised in another context than its caller's (the
    event loop's finaliser task, or the task that ends it), where the token cannot be used:
    there the left transaction has ended, so no one joins it, and the cleanup after this (the
    session's guard and connection) must still run."""
    with contextlib.suppress(ValueError):
        current.reset(token)


def resolved(session: Any) -> Any:
    """A scoped session (``scoped_session``: Flask-SQLAlchemy's ``db.session``;
    ``async_scoped_session``) as the session it names now, the current thread's or task's; any
    other session or factory as it is.

    The caller's code reaches that session through the registry as well (``db.session.add``),
    so it is the caller's session, given: called as a factory instead, the outbox would close
    it at the end, detaching the caller's objects, and a nested transaction given it could not
    tell it from another session than the one it joins, whose writes would then commit apart
    from the messages (or never).
    """
    if isinstance(session, scoped_session):
        return session()
    types = _asyncio_types()
    if types and isinstance(session, types[2]):
        return session()
    return session


@functools.cache
def _asyncio_types() -> tuple[Any, ...]:
    """``(AsyncSession, async_sessionmaker, async_scoped_session)``, or ``()`` where they do not
    import. Looked up once: an import statement costs every transaction ~1 us even when the
    module is loaded."""
    try:
        from sqlalchemy.ext.asyncio import AsyncSession, async_scoped_session, async_sessionmaker
    except ImportError:  # pragma: no cover - SQLAlchemy always ships it; greenlet may not be
        return ()
    return (AsyncSession, async_sessionmaker, async_scoped_session)


@contextlib.contextmanager
def outside() -> Iterator[None]:
    """The block runs in no outbox transaction, whatever its caller is inside.

    The RocketMQ form's local transaction is its own: its listener's answer alone decides the
    op. Called inside another outbox transaction, a listener that opens its local transaction
    with ``producer.transaction(...)`` would join that one instead, so its writes would commit
    (or roll back) with the caller's while the listener's COMMIT delivered the message.
    """
    token = current.set(None)
    try:
        yield
    finally:
        reset(token)


def is_async_session(session: object) -> bool:
    """An ``AsyncSession``, or a factory known to make them (``async_sessionmaker``)."""
    types = _asyncio_types()
    return bool(types) and isinstance(session, types[:2])


def is_sync_session(session: object) -> bool:
    """A ``Session``, or a factory known to make them (``sessionmaker``)."""
    return isinstance(session, Session | sessionmaker)


def described(session: object) -> str:
    """How an error names what it was given: "a module.Class"."""
    return f"a {type(session).__module__}.{type(session).__qualname__}"


def joined(
    form: type[T], session_type: type, session: object, name: str, producer: TransactionHost
) -> T | None:
    """The enclosing transaction a nested one joins (None: there is none).

    Raises:
        WrongFormError: the enclosing one is of the other form.
        ConfigurationError: the nested one was given another session than it, or a producer
            that would send otherwise than its (:func:`producer_differences`).
    """
    outer = current.get()
    if outer is None or outer.state is not None or abandoned(outer):
        return None  # none, one that ended (inherited by a task it left running), or left
    if not isinstance(outer, form):
        raise WrongFormError(
            f"{'an' if name.startswith('a') else 'a'} {name} outbox transaction was opened "
            f"inside the transaction {outer.txn_id} of "
            "the other form; nest transactions of one form (a synchronous one cannot await, an "
            "asyncio one cannot run in a synchronous block)"
        )
    if isinstance(session, session_type) and session is not getattr(outer, "session", None):
        raise ConfigurationError(other_session(outer.txn_id))
    differences = producer_differences(producer, outer.producer)
    if differences:
        raise ConfigurationError(
            f"a nested outbox transaction names a producer (group "
            f"{producer.settings.producer_group!r}) that differs from the one of the transaction "
            f"{outer.txn_id} it joins (group {outer.producer.settings.producer_group!r}) in: "
            f"{', '.join(differences)}; its messages would go through the outer one's Kafka "
            "clients, topics and serializers. Open it with the outer transaction's producer, or "
            "run it outside that transaction"
        )
    return outer


#: Settings a joined transaction's records do not depend on: the internal topics' creation
#: (``ensure_topics``), the producer's check endpoint (the checker asks the outer one's group,
#: which reads the same evidence row) and the operator's database URL. Every other setting,
#: a new one too, is compared.
NOT_SENT_WITH = frozenset(
    {
        "min_compaction_lag_ms",
        "half_retention_ms",
        "op_retention_ms",
        "check_secret",
        "check_previous_secret",
        "check_host",
        "check_port",
        "check_advertise_url",
        "database_url",
    }
)


def producer_differences(nested: TransactionHost, outer: TransactionHost) -> list[str]:
    """What of ``nested`` a transaction joining ``outer``'s would not use: the settings its
    records depend on that differ, by name, and the serializers that are not equal (a
    function: the same function; the key's as ``send()`` chooses it).

    A joined transaction sends through the outer one's producer: its Kafka clients (cluster,
    credentials, half topic, relay), its group, limits and serializers. A second producer that
    sends alike joins; one that does not would have its settings silently ignored - a message
    serialized for other consumers, or sent to another cluster than the one its consumers read.
    A callback or a client id in ``kafka`` made per producer differs too: the outbox cannot
    tell what it does, so such a producer opens its nested transactions with the outer one's.
    """
    if nested is outer:
        return []
    differences = [
        field.name
        for field in dataclasses.fields(nested.settings)
        if field.name not in NOT_SENT_WITH
        and getattr(nested.settings, field.name) != getattr(outer.settings, field.name)
    ]
    if nested.serializer != outer.serializer:
        differences.append("serializer")
    if key_serializer_for(nested.key_serializer, nested.serializer) != key_serializer_for(
        outer.key_serializer, outer.serializer
    ):
        differences.append("key_serializer")
    return differences


def opened(session_type: type[S], session: Any, needs: str) -> tuple[S, bool]:
    """The session to run in, and whether the outbox made it (and closes it).

    Raises:
        WrongFormError: ``session`` is (or made) something else, naming the form that fits.
    """
    own = not isinstance(session, session_type)
    db = session() if callable(session) and own else session
    if not isinstance(db, session_type):
        if isinstance(db, Session):
            db.close()  # made for the wrong form; an AsyncSession holds nothing yet
        fits = (
            "; an AsyncSession runs in `async with`"
            if is_async_session(db)
            else "; a synchronous Session runs in `with`"
            if is_sync_session(db)
            else ""
        )
        raise WrongFormError(f"producer.transaction() in {needs}, got {db!r}{fits}")
    return db, own


def other_session(txn_id: str) -> str:
    """The refusal of a nested transaction given another session than the one it joins."""
    return (
        f"a nested outbox transaction was given another session than the transaction {txn_id} "
        "it joins: its writes would commit apart from the outer transaction's messages; pass "
        "the outer session, or none"
    )

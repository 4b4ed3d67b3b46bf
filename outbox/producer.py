"""The outbox producer: a Kafka client for half and op records, and local transactions around it.

Create one per process and share it between threads::

    settings = OutboxSettings(bootstrap_servers="kafka:9092", producer_group="orders")
    producer = OutboxProducer(settings)
    with producer.transaction(Session) as txn:
        txn.session.add(Order(...))
        txn.send("orders", b"...", key=b"order-1")
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from types import TracebackType

import sqlalchemy as sa
from sqlalchemy.orm import Session

from outbox.checks.handler import CheckSettings
from outbox.checks.listener import CheckingListener, FunctionResolver
from outbox.checks.resolver import FencedResolver, Resolver
from outbox.checks.routing import CheckRouter, OmittedValues
from outbox.checks.server import CheckServer
from outbox.errors import ConfigurationError
from outbox.evidence import write_evidence
from outbox.kafka_io import KafkaIO
from outbox.message import Serializer
from outbox.protocol.states import LocalTransactionState
from outbox.registry import Heartbeat, new_instance_id
from outbox.session_guard import SessionGuard
from outbox.settings import OutboxSettings
from outbox.transaction import OutboxTransaction

log = logging.getLogger("outbox")

SessionSource = Session | Callable[[], Session]

#: The transaction the current thread or task is inside, for ``outbox.send()`` and nesting.
current: ContextVar[OutboxTransaction | None] = ContextVar("outbox_transaction", default=None)


class OutboxProducer:
    """Sends half messages, runs local transactions, writes op records."""

    def __init__(self, settings: OutboxSettings, *, serializer: Serializer | None = None) -> None:
        self.settings = settings
        self.serializer = serializer
        self.kafka = KafkaIO(settings)
        self._partitions: int | None = None
        self._services: list[Callable[[], None]] = []
        self._listener: tuple[CheckingListener, FunctionResolver] | None = None

    @property
    def partitions(self) -> int:
        """Partition count of the half topic (read once from the broker)."""
        if self._partitions is None:
            self._partitions = self.kafka.partitions()
        return self._partitions

    @contextmanager
    def transaction(self, session: SessionSource) -> Iterator[OutboxTransaction]:
        """A local DB transaction whose messages are delivered if and only if it commits.

        ``session`` is a Session, or a factory (``sessionmaker``) whose session is closed at the
        end. On normal exit: DB commit, then a COMMIT op. On exception: DB rollback, a ROLLBACK
        op, and the exception propagates. When the DB commit itself fails, the outcome may be
        unknown (a lost connection during COMMIT), so no op is written, the session's
        connections are closed (invalidated), and the checker resolves it from the evidence row.

        The database transaction must end in that commit: ``session.commit()`` inside the block
        is refused, and a rollback that undoes work a message was sent in (the session's, or a
        savepoint's) makes the outbox roll the whole transaction back
        (:mod:`outbox.session_guard`).

        Raises:
            HalfSendError, InvalidMessageError, TransactionFencedError: from ``send()``.
            CommitInsideTransactionError: ``session.commit()`` was called inside.
            SendRolledBackError: a rollback inside undid work a half message was sent in.
        """
        outer = current.get()
        if outer is not None:  # nested: join the outer transaction
            if isinstance(session, Session) and session is not outer.session:
                raise ConfigurationError(
                    f"a nested outbox transaction was given another session than the "
                    f"transaction {outer.txn_id} it joins: its writes would commit apart from "
                    "the outer transaction's messages; pass the outer session, or none"
                )
            yield outer
            return
        own = not isinstance(session, Session)
        db = session() if callable(session) and own else session
        if not isinstance(db, Session):
            raise ConfigurationError(
                f"producer.transaction() needs a SQLAlchemy Session or sessionmaker, got {db!r}"
            )
        txn = OutboxTransaction(self, on_sent=_on_sent(db))
        txn.session = db
        guard = SessionGuard.attach(db, txn.txn_id)
        token = current.set(txn)
        try:
            yield txn
            guard.check()
            guard.committing()
            self._commit(db, txn)
        except BaseException:
            if txn.state is None:
                _rollback(db, txn)
            raise
        finally:
            guard.detach()
            current.reset(token)
            if own:
                db.close()

    def _commit(self, db: Session, txn: OutboxTransaction) -> None:
        try:
            db.commit()
        except BaseException:
            txn.state = LocalTransactionState.UNKNOWN
            log.warning("DB commit of transaction %s failed; leaving it to the checker", txn.txn_id)
            _discard_connections(db, txn)
            raise
        txn.finish(LocalTransactionState.COMMIT)

    def serve_checks(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        engine: sa.Engine | None = None,
        resolver: Resolver | None = None,
        secret: bytes | str | None = None,
        insecure_local: bool = False,
        advertise_url: str | None = None,
        lock_timeout_s: float = 2.0,
    ) -> CheckServer:
        """Serve the check endpoint and announce it in the registry until ``close()``.

        Each check goes to what its transaction's half records name: transactions of the
        decorator and context-manager forms to ``resolver``, by default the fenced resolution
        on ``engine``; ``TransactionalProducer`` transactions to the listener's
        ``check_local_transaction`` (:meth:`set_transaction_listener`), never to the evidence
        table, where they leave no row.

        Raises:
            ConfigurationError: no secret (unless ``insecure_local``), or nothing to answer
                with: neither engine nor resolver, and no transaction listener.
        """
        if isinstance(secret, str):
            secret = secret.encode()
        check_settings = CheckSettings(secret=secret, insecure_local=insecure_local)
        if resolver is None and engine is not None:
            resolver = FencedResolver(
                engine, self.settings.producer_group, lock_timeout_s=lock_timeout_s
            )
        if resolver is None and self._listener is None:
            raise ConfigurationError(
                "serve_checks needs engine= (your database) or resolver=, or a "
                "TransactionalProducer created first (its listener answers its checks)"
            )
        values = OmittedValues(self._kafka_config(), self.settings.topics.half)
        router = CheckRouter(resolver, self._listener_resolver, values)
        instance_id = new_instance_id()
        server = CheckServer(check_settings, router, host, port, instance_id=instance_id)
        heartbeat = Heartbeat(
            self.settings,
            advertise_url or server.url,
            version=_version(),
            instance_id=instance_id,
        )
        self._services += [heartbeat.close, server.close, values.close]
        return server

    def set_transaction_listener(
        self, listener: CheckingListener, *, answer_timeout_s: float = 5.0
    ) -> FunctionResolver:
        """Make the listener's ``check_local_transaction`` answer the checks of transactions
        sent through ``TransactionalProducer`` (RocketMQ's ``setTransactionListener``);
        ``TransactionalProducer`` calls this itself. Returns the resolver that asks it.

        Raises:
            ConfigurationError: another listener is already set: checks could not tell which
                one a transaction belongs to (use another producer group for it).
        """
        if self._listener is not None:
            if self._listener[0] is listener:
                return self._listener[1]
            raise ConfigurationError(
                f"this producer already has the transaction listener {self._listener[0]!r}; "
                "one producer group has one listener (as in RocketMQ), because a check only "
                "names the group - give the second listener an OutboxProducer of its own "
                "producer group"
            )
        resolver = FunctionResolver(
            listener.check_local_transaction, answer_timeout_s=answer_timeout_s
        )
        self._listener = (listener, resolver)
        return resolver

    def _listener_resolver(self) -> FunctionResolver | None:
        return None if self._listener is None else self._listener[1]

    def _kafka_config(self) -> dict[str, object]:
        return {"bootstrap.servers": self.settings.bootstrap_servers, **self.settings.kafka}

    def close(self, timeout: float = 10.0) -> None:
        """Stop serving checks (tombstoning this instance), flush, release the Kafka client."""
        while self._services:
            self._services.pop(0)()
        self.kafka.close(timeout)

    def __enter__(self) -> OutboxProducer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _version() -> str:
    from outbox import __version__

    return __version__


def _on_sent(db: Session) -> Callable[[OutboxTransaction, bool], None]:
    """After each half send: the evidence row with the first, then the scopes to watch."""

    def sent(txn: OutboxTransaction, first: bool) -> None:
        if first:
            write_evidence(db, txn.txn_id, txn.producer.settings.producer_group)
        guard = SessionGuard.of(db)
        if guard is not None:
            guard.sent()

    return sent


def _discard_connections(db: Session, txn: OutboxTransaction) -> None:
    """Close the connections of a session whose COMMIT failed, whatever they still hold.

    SQLite keeps the transaction open, with its write lock, when a deferred constraint fails
    at COMMIT, and SQLAlchemy, counting the transaction as ended, returns the connection to
    its pool without a rollback: every later writer, the check's fence included, would wait
    for that lock, and the check would answer UNKNOWN until the transaction is given up.
    """
    try:
        db.invalidate()
    except Exception:
        log.exception("closing the connections of transaction %s failed", txn.txn_id)


def _rollback(db: Session, txn: OutboxTransaction) -> None:
    try:
        db.rollback()
    except Exception:
        # The DB did not commit either way; the ROLLBACK op below is still the truth.
        log.exception("DB rollback of transaction %s failed", txn.txn_id)
    txn.finish(LocalTransactionState.ROLLBACK)

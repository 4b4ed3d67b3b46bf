"""The outbox producer: a Kafka client for half and op records, and local transactions around it.

Create one per process and share it between threads::

    settings = OutboxSettings(bootstrap_servers="kafka:9092", producer_group="orders")
    producer = OutboxProducer(settings)
    with producer.transaction(Session) as txn:
        txn.session.add(Order(...))
        txn.send("orders", b"...", key=b"order-1")

    async with producer.transaction(AsyncSession) as txn:   # asyncio: the same, awaited
        txn.session.add(Order(...))
        await txn.send("orders", b"...", key=b"order-1")

With ``prometheus_client`` installed (the ``metrics`` extra) the producer counts its sends, ops,
checks and fences in its default ``REGISTRY``, or in ``metrics_registry=``
(:mod:`outbox.metrics`); without it, nothing is imported or counted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, Union

import sqlalchemy as sa

from outbox import tracing
from outbox.checks.advertise import warn_unreachable
from outbox.checks.asgi import CheckApp
from outbox.checks.async_resolver import AsyncFencedResolver
from outbox.checks.handler import CheckSettings
from outbox.checks.listener import CheckingListener, FunctionResolver
from outbox.checks.resolver import FencedResolver, Resolver
from outbox.checks.routing import CheckRouter, OmittedValues
from outbox.checks.server import CheckServer
from outbox.closing import close_each
from outbox.errors import ConfigurationError, ProducerClosedError, WrongFormError
from outbox.forking import PerProcess
from outbox.kafka_io import KafkaIO
from outbox.message import Serializer
from outbox.metrics import producer_metrics
from outbox.nesting import SessionSource
from outbox.registry import Heartbeat, new_instance_id
from outbox.scope import TransactionScope
from outbox.settings import OutboxSettings
from outbox.witnesses import CommitWitnesses

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession


#: An ``AsyncSession`` or a factory of them (``async_sessionmaker``): the asyncio form.
AsyncSessionSource = Union["AsyncSession", Callable[[], "AsyncSession"]]


log = logging.getLogger("outbox")


class OutboxProducer:
    """Sends half messages, runs local transactions, writes op records.

    ``serializer`` / ``key_serializer``: what ``send()`` uses when it is given none
    (:mod:`outbox.serialization`).

    ``metrics_registry``: where its metrics go; None (the default) is prometheus_client's
    ``REGISTRY`` if it is installed, else no metrics. Producers sharing a registry share its
    collectors, each under its ``group`` label (:mod:`outbox.metrics`).

    Raises:
        ForkedWithLockHeldError: made in a process forked with a lock held that its Kafka clients
            need (:mod:`outbox.fork_checks`): replace the process.
    """

    def __init__(
        self,
        settings: OutboxSettings,
        *,
        serializer: Serializer | None = None,
        key_serializer: Serializer | None = None,
        metrics_registry: CollectorRegistry | None = None,
    ) -> None:
        self.settings = settings
        self.serializer = serializer
        self.key_serializer = key_serializer
        #: None without prometheus_client; for a resolver made by hand (``metrics=``).
        self.metrics = producer_metrics(settings.producer_group, metrics_registry)
        #: The latest transaction committed in each database: the check endpoint's resolver
        #: fences only in a database where it sees them (:mod:`outbox.witnesses`).
        self.witnesses = CommitWitnesses()
        tracing.load()  # the OpenTelemetry API, if installed (outbox.tracing)
        self._closed = False
        self._kafka = PerProcess(self._new_clients, "Kafka clients")
        self._partitions: int | None = None
        #: What ``close()`` stops; each knows which part of it is its process's to close.
        self._services: list[Callable[[], None]] = []
        self._listener: tuple[CheckingListener, FunctionResolver] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _new_clients(self) -> KafkaIO:
        if self._closed:  # closed before its process forked: closed in the child too
            raise ProducerClosedError("this outbox producer is closed; create a new one")
        return KafkaIO(self.settings, self.metrics)

    @property
    def kafka(self) -> KafkaIO:
        """This process's Kafka clients: made again on first use in a forked child
        (:mod:`outbox.forking`)."""
        return self._kafka.get()

    @property
    def partitions(self) -> int:
        """Partition count of the half topic (read once from the broker)."""
        if self._partitions is None:
            self._partitions = self.kafka.partitions()
        return self._partitions

    @property
    def known_partitions(self) -> int | None:
        """The half topic's partition count if it was read already (no broker request)."""
        return self._partitions

    def transaction(self, session: SessionSource | AsyncSessionSource) -> TransactionScope:
        """A local DB transaction whose messages are delivered if and only if it commits.

        ``session`` is a Session, or a factory (``sessionmaker``) whose session is closed at the
        end: ``with producer.transaction(session) as txn``. An ``AsyncSession`` (or an
        ``async_sessionmaker``) runs the same transaction in asyncio:
        ``async with producer.transaction(session) as txn`` and ``await txn.send(...)``.

        On normal exit: DB commit, then a COMMIT op. On exception: DB rollback, a ROLLBACK
        op, and the exception propagates. When the DB commit itself fails, the outcome may be
        unknown (a lost connection during COMMIT), so no op is written, the session's
        connections are closed (invalidated), and the checker resolves it from the evidence row.

        The database transaction must end in that commit: ``session.commit()`` inside the block
        is refused, and a rollback that undoes work a message was sent in (the session's, or a
        savepoint's) makes the outbox roll the whole transaction back
        (:mod:`outbox.session_guard`).

        Opened inside another outbox transaction, it joins that one (:mod:`outbox.nesting`).

        Raises:
            HalfSendError, InvalidMessageError, TransactionFencedError: from ``send()``.
            CommitInsideTransactionError: ``session.commit()`` was called inside.
            SendRolledBackError: a rollback inside undid work a half message was sent in.
            WrongFormError: a Session in ``async with``, or an AsyncSession in ``with``.
            ConfigurationError: opened inside another transaction, with another session than
                that one's, or by a producer that would send otherwise than that one's.
            ForkedWithLockHeldError: from the first send in a process forked with a lock held
                that its Kafka clients need (:mod:`outbox.fork_checks`): replace the process.
        """
        return TransactionScope(self, session)

    def serve_checks(
        self,
        host: str | None = None,
        port: int | None = None,
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
        table, where they leave no row. ``host``, ``port``, ``secret`` and ``advertise_url``
        default to the settings' ``check_host``, ``check_port``, ``check_secret`` (with
        ``check_previous_secret``) and ``check_advertise_url``.

        Raises:
            ConfigurationError: no secret (unless ``insecure_local``), or nothing to answer
                with: neither engine nor resolver, and no transaction listener; or Kafka
                refused the first heartbeat to the registry topic (an ACL missing).
            ForkedWithLockHeldError: this process was forked with a lock held that its Kafka
                clients need (:mod:`outbox.fork_checks`): replace the process.
        """
        if is_async_engine(engine):
            raise WrongFormError(
                "serve_checks() was given an AsyncEngine; serve an asyncio application's checks "
                "with producer.check_app(engine=...), an ASGI app for its own event loop"
            )
        host = self.settings.check_host if host is None else host
        port = self.settings.check_port if port is None else port
        advertise_url = advertise_url or self.settings.check_advertise_url
        check_settings = self._check_settings(secret, insecure_local)
        router = self._router(engine, resolver, lock_timeout_s, "serve_checks")
        instance_id = new_instance_id()
        server = CheckServer(
            check_settings, router, host, port, instance_id=instance_id, metrics=self.metrics
        )
        warn_unreachable(host, server.url, advertise_url)
        try:
            heartbeat = Heartbeat(
                self.settings,
                advertise_url or server.url,
                version=_version(),
                instance_id=instance_id,
                metrics=self.metrics,
            )
        except BaseException:
            close_each([server.close, router.close], log, what="the check endpoint not started")
            raise
        self._services += [heartbeat.close, server.close, router.close]
        return server

    def check_app(
        self,
        *,
        advertise_url: str | None = None,
        engine: sa.Engine | AsyncEngine | None = None,
        resolver: Resolver | AsyncFencedResolver | None = None,
        secret: bytes | str | None = None,
        insecure_local: bool = False,
        lock_timeout_s: float = 2.0,
    ) -> CheckApp:
        """The check endpoint as an ASGI app (:mod:`outbox.checks.asgi`) for an asyncio service.

        Answers as :meth:`serve_checks` does; an ``AsyncEngine`` is answered from on the app's
        event loop (:class:`~outbox.checks.async_resolver.AsyncFencedResolver`). Its heartbeat
        announces ``advertise_url`` (where the checker reaches the app, with the prefix it is
        mounted under) while the app runs: from the ASGI lifespan, or ``async with
        app.running()`` in the service's own lifespan when mounted. Each process serving it
        heartbeats an instance id of its own. ``advertise_url`` and ``secret`` default to the
        settings' ``check_advertise_url`` and ``check_secret`` (with ``check_previous_secret``).

        Its startup (the lifespan's, or ``running()``) raises :class:`ConfigurationError` when
        Kafka refuses the first heartbeat to the registry topic (an ACL missing), and
        :class:`ForkedWithLockHeldError` in a process forked with a lock held that its Kafka
        clients need (:mod:`outbox.fork_checks`).

        Raises:
            ConfigurationError: no secret (unless ``insecure_local``), nothing to answer with,
                or no ``advertise_url`` that is an http(s) URL.
        """
        advertise_url = advertise_url or self.settings.check_advertise_url
        if advertise_url is None:
            raise ConfigurationError(
                "check_app() needs the URL the checker reaches this service at: pass "
                "advertise_url= or set OUTBOX_CHECK_ADVERTISE_URL (e.g. http://$(POD_IP):8000)"
            )
        if not advertise_url.startswith(("http://", "https://")):
            raise ConfigurationError(
                f"advertise_url={advertise_url!r} is not an http(s) URL; give the URL the "
                "checker reaches this service at, e.g. http://orders.shop.svc:8000"
            )
        if resolver is None and is_async_engine(engine):
            resolver = AsyncFencedResolver(
                engine,  # type: ignore[arg-type]
                self.settings.producer_group,
                lock_timeout_s=lock_timeout_s,
                metrics=self.metrics,
                witnesses=self.witnesses,
            )
        warn_unreachable(None, advertise_url, advertise_url)
        check_settings = self._check_settings(secret, insecure_local)
        router = self._router(engine, resolver, lock_timeout_s, "check_app")
        announced = advertise_url

        def start() -> Callable[[], None]:
            heartbeat = Heartbeat(
                self.settings, announced, version=_version(), metrics=self.metrics
            )
            return heartbeat.close

        app = CheckApp(
            check_settings, router, start=start, on_loop=self.use_loop, metrics=self.metrics
        )
        self._services.append(router.close)
        return app

    def _check_settings(self, secret: bytes | str | None, insecure_local: bool) -> CheckSettings:
        """``secret`` (else the settings' secret) and the settings' previous secret: code that
        passes its secret keeps the rotation overlap the settings ask for. An empty secret is
        none (an unset variable rendered as ``""``)."""
        return CheckSettings(
            secret=_as_bytes(secret or self.settings.check_secret),
            previous_secret=_as_bytes(self.settings.check_previous_secret),
            insecure_local=insecure_local,
        )

    def _router(
        self,
        engine: Any,
        resolver: Resolver | AsyncFencedResolver | None,
        lock_timeout_s: float,
        name: str,
    ) -> CheckRouter:
        if resolver is None and engine is not None:
            resolver = FencedResolver(
                engine,
                self.settings.producer_group,
                lock_timeout_s=lock_timeout_s,
                metrics=self.metrics,
                witnesses=self.witnesses,
            )
        if resolver is None and self._listener is None:
            raise ConfigurationError(
                f"{name} needs engine= (your database) or resolver=, or a "
                "TransactionalProducer created first (its listener answers its checks)"
            )
        values = OmittedValues(self._kafka_config(), self.settings.topics.half)
        return CheckRouter(resolver, self._listener_resolver, values)

    def use_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The application's event loop: a listener's async ``check_local_transaction`` runs on
        it (the asyncio forms and the ASGI check endpoint tell it when they start)."""
        self._loop = loop
        if self._listener is not None:
            self._listener[1].loop = loop

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
        resolver.loop = self._loop
        self._listener = (listener, resolver)
        return resolver

    def _listener_resolver(self) -> FunctionResolver | None:
        return None if self._listener is None else self._listener[1]

    def _kafka_config(self) -> dict[str, object]:
        return {"bootstrap.servers": self.settings.bootstrap_servers, **self.settings.kafka}

    def close(self, timeout: float = 10.0) -> None:
        """Stop serving checks (tombstoning this instance), flush, release the Kafka clients.

        In a process forked from the one that made the producer (a preloading server's worker:
        :mod:`outbox.forking`), only what that process started. The check endpoint and heartbeat
        it inherited are its parent's, whose thread alone serves them, and they go on answering
        for the whole producer group there (an instance of the group answers any of its checks),
        so a worker's ``close()`` does not tombstone them; the clients it inherited are never
        used in it.

        Each part is closed whatever the one before it raised; a ``KafkaException`` (a broker
        that is gone) is logged, and any other error is raised once everything is closed.
        """
        services, self._services = self._services, []
        # a forked child makes no clients after this: a send raises ProducerClosedError; and
        # clients another of its threads is making now are waited for, so closed below
        self._closed = True
        kafka = self._kafka.made_here()
        # each whatever the one before raised: a heartbeat or reader that fails to close must
        # not leave the endpoint serving or the op records of committed transactions unflushed
        closers = [*services, None if kafka is None else partial(kafka.close, timeout)]
        if self._listener is not None:  # the marks' folder its forked workers share
            closers.append(self._listener[1].executing_marks.remove)
        close_each(closers, log, what="the outbox producer's services and Kafka clients")

    def __enter__(self) -> OutboxProducer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _as_bytes(secret: bytes | str | None) -> bytes | None:
    return (secret.encode() if isinstance(secret, str) else secret) or None


def is_async_engine(engine: object) -> bool:
    try:
        from sqlalchemy.ext.asyncio import AsyncEngine
    except ImportError:  # pragma: no cover
        return False
    return isinstance(engine, AsyncEngine)


def _version() -> str:
    from outbox import __version__

    return __version__

"""Keeping the local transaction whole between the first half message and the outbox's COMMIT.

The evidence row is written with the first half message (while it travels, or once it is
acknowledged on SQLite), and it must be in the commit that makes the transaction's work
durable: a check that finds no row fences the id and answers ROLLBACK. User code inside
``@outbox.transactional`` or ``producer.transaction()`` can break that with ordinary
SQLAlchemy calls:

- ``session.rollback()`` (or ``close()``) after a send: the evidence row and everything before it
  are gone, and the writes that follow commit in a new database transaction;
- a savepoint (``session.begin_nested()``) rolled back after a send inside it: the work around
  the message is undone, but a sent half message cannot be taken back;
- ``session.commit()``: the work commits before the outbox decides, and an exception after it
  would write a ROLLBACK op for committed work.

The rule: **a half message belongs to the database transaction scope it was sent in.** A
rollback that undoes a scope a message was sent in undoes that message's reason to exist, and a
sent message cannot be un-sent, so the outbox refuses to commit: the whole transaction rolls
back, a ROLLBACK op is written and :class:`~outbox.errors.SendRolledBackError` is raised.
A rollback of a savepoint that holds no send (``try: with session.begin_nested(): ...``) is
fine. ``session.commit()`` inside the transaction is refused on the spot
(:class:`~outbox.errors.CommitInsideTransactionError`), before the database commits anything,
and the transaction is rolled back when it ends even if the caller caught the error.

The session's ``Connection`` used directly - ``session.connection().commit()``, ``.rollback()``,
``.close()`` - ends the database transaction with no session event, so it cannot be refused
before it runs. The session still holds that transaction, inactive: the next send is refused
(:class:`~outbox.errors.TransactionEndedError`, before any of it is sent) and so is the
outbox's COMMIT. Whether the work before the call committed, the guard cannot tell; its
evidence row can: no op is written, the checker asks, and the messages sent before the call
follow that work. What ran after it is rolled back. (Savepoints begun and rolled back through
the connection or as SQL are followed by their statements: :mod:`outbox.transaction_statements`.)

The guard hangs off ``Session.info`` and listens through five class-level SQLAlchemy session
events, registered once; a session the outbox does not run costs a dictionary lookup.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction

from outbox.errors import (
    CommitInsideTransactionError,
    SendRolledBackError,
    TransactionEndedError,
)
from outbox.held_connections import held_connections

_KEY = "outbox.guard"


class SessionGuard:
    """Watches one session for the duration of one outbox transaction."""

    def __init__(self, session: Session, txn_id: str) -> None:
        self.session = session
        self.txn_id = txn_id
        #: The database transaction scopes (root and savepoints) active at some send.
        self._scopes: list[SessionTransaction] = []
        self._sends = 0
        self._broken: str | None = None
        self._committing = False
        #: Why the transaction cannot commit, raised again by :meth:`check` even if caught: a
        #: ``commit()`` inside it, a session that cannot carry it
        #: (:mod:`outbox.database_transaction`), or a write to a second database
        #: (:mod:`outbox.other_databases`).
        self._refused: Exception | None = None
        #: Connections watched (:mod:`outbox.other_databases`), each with what stops watching
        #: it when the transaction ends; keyed by the connection itself, held until then, so a
        #: new connection at a closed one's address is not taken for it.
        self._watched: dict[object, Callable[[], None]] = {}
        #: The session's bind for the evidence INSERT, asked for once (the same module).
        self.evidence_bind: object | None = None
        #: The database transaction the outbox's COMMIT commits (:meth:`committing`), and
        #: whether SQLAlchemy rolled it back inside that ``commit()`` (a failed flush).
        self._committed: SessionTransaction | None = None
        self._rolled_back_in_commit = False
        #: Whether it was found ended under the session (:meth:`ended_under_it`) as that
        #: ``commit()``'s flush began.
        self._ended_in_commit = False

    @classmethod
    def attach(cls, session: Session, txn_id: str) -> SessionGuard:
        guard = cls(session, txn_id)
        session.info[_KEY] = guard
        return guard

    @staticmethod
    def of(session: Session) -> SessionGuard | None:
        """The guard watching ``session``, if an outbox transaction runs on it."""
        guard = session.info.get(_KEY)
        return guard if isinstance(guard, SessionGuard) else None

    def detach(self) -> None:
        if self.session.info.get(_KEY) is self:
            del self.session.info[_KEY]
        for stop in self._watched.values():
            with contextlib.suppress(Exception):  # stopping must not hide the transaction's end
                stop()
        self._watched.clear()

    def watching(self, connection: object) -> bool:
        return connection in self._watched

    def watch(self, connection: object, stop: Callable[[], None]) -> None:
        """``connection`` is watched until the transaction ends; then ``stop()`` is called."""
        self._watched[connection] = stop

    @property
    def sends(self) -> int:
        """How many sends the transaction made so far (a savepoint holds those made after it
        began: :mod:`outbox.transaction_statements`)."""
        return self._sends

    def sent(self) -> None:
        """A half message was sent: the scopes open now must end in the outbox's commit."""
        self._sends += 1
        scope = self.session.get_nested_transaction() or self.session.get_transaction()
        while scope is not None:
            if not any(s is scope for s in self._scopes):
                self._scopes.append(scope)
            scope = scope.parent

    def broke(self, what: str) -> None:
        """``what`` (a rollback) undid work a half message was sent in: :meth:`check` raises
        :class:`~outbox.errors.SendRolledBackError` saying so."""
        if self._broken is None:
            self._broken = what

    def ended_under_it(self) -> bool:
        """Whether a database transaction the session began was committed or rolled back
        through its ``Connection`` (``session.connection().commit()``, ``.rollback()``,
        ``.close()``), which no session event reports: the session still holds it, inactive,
        and what runs next runs in a new one the outbox never commits. Which of the two it was
        cannot be told here: the evidence row, committed with it or not, answers a check. Reads
        the session's state only (no statement), so asyncio code calls it directly."""
        root = self.session.get_transaction()
        if root is None or not root.is_active:
            return False  # nothing begun, or rolled back by the session itself (a failed flush)
        return any(
            held.transaction is not None and not held.transaction.is_active
            for held in held_connections(root)
        )

    def may_send(self) -> None:
        """Before a send's records are handed to Kafka: refuse it once the session's database
        transaction was ended under it (:meth:`ended_under_it`). Its work would run in a
        database transaction the outbox does not commit, while its message joined those of the
        work before, which may have committed.

        Raises:
            TransactionEndedError: so; nothing of the send was sent.
        """
        if self.ended_under_it():
            raise self.refuse(TransactionEndedError(_ended_message(self.txn_id)))

    def check(self) -> None:
        """Raise, before the outbox commits, when the transaction is no longer whole.

        Raises:
            CommitInsideTransactionError: code inside the transaction called ``commit()``;
                AutocommitSessionError, ExternalTransactionError: the session cannot carry
                it; MultipleDatabasesError: it wrote a second database (the first of these,
                :meth:`refuse`).
            TransactionEndedError: the session's database transaction was committed or
                rolled back through its connection.
            SendRolledBackError: a rollback undid a scope a half message was sent in.
        """
        if self._refused is not None:
            raise self._refused
        if self.ended_under_it():
            raise self.refuse(TransactionEndedError(_ended_message(self.txn_id)))
        if self._broken is not None:
            raise SendRolledBackError(
                f"transaction {self.txn_id}: {self._broken} after a half message was sent in "
                "it; a sent message cannot be taken back, so the outbox rolled back the whole "
                "transaction and its messages will never be delivered. Send messages only in "
                "work that commits: send after the savepoint is released, or raise to abandon "
                "the transaction and retry it as a new one"
            )

    def refuse(self, err: Exception) -> Exception:
        """This transaction cannot commit (a ``commit()`` inside it, autocommit, a transaction
        the session does not own, a write to a second database): ``err``, to raise now;
        :meth:`check` raises the first one again before the COMMIT, even if the caller caught
        it."""
        if self._refused is None:
            self._refused = err
        return err

    def never_committed(self, err: BaseException) -> bool:
        """Whether the outbox's own ``db.commit()``, which raised ``err``, failed before it
        asked the database to COMMIT: then nothing committed, and the transaction rolls back
        at once (its ROLLBACK op written) rather than waiting for a check.

        ``Session.commit()`` runs the ``before_commit`` listeners, then flushes, then marks
        the transaction prepared (from then on SQLAlchemy refuses to roll it back) and
        commits each connection. Known to be before that last step, by the transaction's own
        state, not by what was raised:
        - it is still active: a listener's exception (or a signal handler's) before the
          flush, the outbox's refusal from a ``before_commit`` check included;
        - SQLAlchemy rolled it back inside the call (``after_rollback`` with it no longer
          active): it does so when a flush fails - the commonest case, an ``IntegrityError``
          from an object added after the last flush, or the outbox's refusal of a statement.
        Not when its database transaction was ended under the session meanwhile - a listener
        committed through the session's ``Connection`` (:meth:`ended_under_it`), seen as the
        commit's flush begins (:func:`_on_transaction_create`), when the commit fails, or by a
        held connection gone on in a database transaction the session does not hold: the work
        before may have committed. (One committing so from inside the flush, a mapper event,
        with the flush failing before its next statement, is not seen.) Anything else - the
        database refusing the COMMIT, a connection lost during it, an ``after_commit``
        listener raising - may follow a COMMIT that happened: UNKNOWN.
        """
        root = self._committed
        if root is None:
            return err is self._refused
        if self._ended_in_commit or _went_on(root):
            return False
        if root.is_active:
            return not self.ended_under_it()
        return self._rolled_back_in_commit

    def committing(self) -> None:
        """The outbox's own COMMIT is next: let it through."""
        self._committing = True
        self._committed = self.session.get_transaction()

    # -- the session events --------------------------------------------------------------

    def _before_commit(self, session: Session) -> None:
        if self._committing or session.in_nested_transaction():
            return  # the outbox's own commit, or a savepoint's release
        raise self.refuse(CommitInsideTransactionError(_commit_message(self.txn_id)))

    def _rolled_back(self, scope: SessionTransaction) -> None:
        if any(s is scope for s in self._scopes):
            self.broke("a savepoint was rolled back" if scope.nested else "the session rolled back")

    def _ended(self, scope: SessionTransaction) -> None:
        if self._committing or scope.parent is not None or self._broken is not None:
            return
        if any(s is scope for s in self._scopes):
            self._broken = "the session's transaction ended (rolled back or closed)"


def may_send(session: Session) -> Callable[[], None]:
    """What a transaction on ``session`` asks before each send (built before its guard is
    attached): :meth:`SessionGuard.may_send`, when a guard watches it."""

    def check() -> None:
        guard = SessionGuard.of(session)
        if guard is not None:
            guard.may_send()

    return check


def _ended_message(txn_id: str) -> str:
    return (
        f"transaction {txn_id}: the session's database transaction was committed or rolled "
        "back through its connection (session.connection().commit(), .rollback() or .close() "
        "inside the outbox transaction), which the outbox cannot prevent: what ran before that "
        "call is committed or undone with it, and its messages follow it (the checker asks the "
        "evidence row); what ran after it is rolled back and no message of it is sent. Remove "
        "the call: the outbox commits when the decorated function returns (or the `with` block "
        "ends); use session.flush() to send SQL early"
    )


def _commit_message(txn_id: str) -> str:
    return (
        f"transaction {txn_id}: session.commit() was called inside an outbox transaction; the "
        "outbox commits when the decorated function returns (or the `with` block ends), after "
        "which it writes the COMMIT op. Remove the call (use session.flush() to send SQL "
        "early); the transaction is rolled back"
    )


@event.listens_for(Session, "before_commit")
def _on_before_commit(session: Session) -> None:
    guard = SessionGuard.of(session)
    if guard is not None:
        guard._before_commit(session)


@event.listens_for(Session, "after_soft_rollback")
def _on_soft_rollback(session: Session, previous: SessionTransaction) -> None:
    guard = SessionGuard.of(session)
    if guard is not None:
        guard._rolled_back(previous)


@event.listens_for(Session, "after_rollback")
def _on_rollback(session: Session) -> None:
    guard = SessionGuard.of(session)
    if guard is None or not guard._committing:
        return
    root = guard._committed  # the transaction itself, not a savepoint a listener rolled back
    if root is not None and session.get_transaction() is root and not root.is_active:
        guard._rolled_back_in_commit = True


@event.listens_for(Session, "after_transaction_create")
def _on_transaction_create(session: Session, scope: SessionTransaction) -> None:
    # The outbox's commit() flushes in a transaction it creates after every before_commit and
    # before_flush listener ran: a listener's commit through the connection is seen here,
    # before SQLAlchemy's rollback of a failed flush would hide it.
    guard = SessionGuard.of(session)
    if guard is not None and guard._committing and not guard._ended_in_commit:
        guard._ended_in_commit = guard.ended_under_it()


def _went_on(root: SessionTransaction) -> bool:
    """Whether a connection ``root`` holds is in a database transaction ``root`` does not
    hold (ended under the session, then begun again by a statement)."""
    for held in held_connections(root):
        now = held.connection.get_transaction()
        if now is not None and now is not held.transaction:
            return True
    return False


@event.listens_for(Session, "after_transaction_end")
def _on_transaction_end(session: Session, scope: SessionTransaction) -> None:
    guard = SessionGuard.of(session)
    if guard is not None:
        guard._ended(scope)

"""The savepoints begun over one connection of an outbox transaction, and when a rollback to one
undoes a send.

A half message belongs to the database transaction scope it was sent in
(:mod:`outbox.session_guard`). The savepoints a session begins itself are seen by its events;
these are followed by their statements (:mod:`outbox.transaction_statements`), whoever runs
them: the session, a Core ``Connection.begin_nested()``, or code that writes ``SAVEPOINT`` as
SQL. Each is marked with how many sends the transaction had made when it began; a rollback to
it after a later send undid work a half message was sent in.
"""

from __future__ import annotations


class Savepoints:
    """The savepoints begun over one connection, each with the number of sends the
    transaction had made when it began; says when a rollback to one undoes a send."""

    def __init__(self) -> None:
        self._marks: list[tuple[str, int]] = []

    def begun(self, name: str, sends: int) -> None:
        self._marks.append((name, sends))

    def begun_unconfirmed(self, name: str, sends: int) -> None:
        """Begun, unless its statement fails unnoticed (:meth:`not_begun` will not be called):
        marked with the sends of the savepoint of that name before it, if any, which a
        rollback to the name would reach then. A rollback to it may so be refused though no
        send was undone, never let through when one was."""
        at = self._find(name)
        self._marks.append((name, sends if at is None else min(sends, self._marks[at][1])))

    def not_begun(self, name: str) -> None:
        """The latest savepoint of that name was never begun after all (its statement failed):
        forget it alone."""
        at = self._find(name)
        if at is not None:
            del self._marks[at]

    def released(self, name: str) -> None:
        """It and every savepoint begun after it are gone (a name never begun: nothing)."""
        at = self._find(name)
        if at is not None:
            del self._marks[at:]

    def rolled_back(self, name: str, sends: int) -> bool:
        """Whether a send was made since it began (it stays; those begun after it are gone).
        A name never begun here was begun before the watch: it holds every send."""
        at = self._find(name)
        if at is None:
            return sends > 0
        del self._marks[at + 1 :]
        return sends > self._marks[at][1]

    def _find(self, name: str) -> int | None:
        for at in range(len(self._marks) - 1, -1, -1):
            if self._marks[at][0] == name:
                return at
        return None

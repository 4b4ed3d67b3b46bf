"""Statements that end the database transaction, run as SQL inside an outbox transaction.

``session.commit()`` and ``session.rollback()`` inside an outbox transaction are seen through
the session's events (:mod:`outbox.session_guard`). The same steps written as SQL -
``session.execute(text("COMMIT"))``, ``END``, ``ROLLBACK``, ``ABORT``, ``PREPARE TRANSACTION``
(code that wants ``CREATE INDEX CONCURRENTLY`` or ``VACUUM`` often does this) - go straight to
the database: a ``COMMIT`` made the work and the evidence row durable before the outbox decided,
so a failure after it wrote a ROLLBACK op for committed work (its messages never delivered); a
``ROLLBACK`` after a send undid the work and the evidence row while the outbox's COMMIT went on
with what followed, delivering messages for work that was gone.

Such a statement over the evidence row's connection is refused before it runs
(:class:`~outbox.errors.TransactionStatementError`; the connection is watched by
:mod:`outbox.other_databases`, through :mod:`outbox.statement_watch`), and the transaction
rolls back when it ends, even if the caller caught the error. ``ROLLBACK TO SAVEPOINT`` and
``RELEASE SAVEPOINT`` (what ``begin_nested()`` runs) are not refused, nor is a ``BEGIN`` (a
no-op warning on PostgreSQL, an error on SQLite).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

import sqlalchemy as sa

from outbox import statement_watch
from outbox.errors import TransactionStatementError
from outbox.session_guard import SessionGuard

#: What comes before a statement's first keyword: blanks, parentheses and comments (no comment
#: body can hold its own end, and the group is possessive, so no input makes a match
#: backtrack). Shared with :mod:`outbox.other_databases`.
LEADING = r"(?:\s|\(|--[^\n]*\n|#[^\n]*\n|/\*(?:[^*]|\*(?!/))*\*/)*+"
#: The first keyword and up to two more.
_WORDS = re.compile(LEADING + r"([A-Za-z]+)(?:\s+([A-Za-z]+))?(?:\s+([A-Za-z]+))?")
_ENDS = frozenset(["COMMIT", "END", "ABORT"])
#: Statements at most this long have their answer remembered (:func:`ends_transaction`).
CACHED_LENGTH = 2048


def ends_transaction(statement: str) -> bool:
    """Whether ``statement`` commits, rolls back or prepares the transaction it runs in (not a
    savepoint's ``ROLLBACK TO``).

    Every statement of an outbox transaction's connection is asked, and most are the same few
    texts again (SQLAlchemy caches its compiled SQL): their answers are remembered, which
    costs a dictionary lookup instead of a regular expression. Only short texts are, so the
    memory this holds stays bounded (``CACHED_LENGTH`` x 1,024 entries at most).
    """
    if len(statement) <= CACHED_LENGTH:
        return _ends_cached(statement)
    return _ends(statement)


def _ends(statement: str) -> bool:
    found = _WORDS.match(statement)
    if found is None:
        return False
    words = [w.upper() for w in found.groups() if w]
    first = words[0]
    if first in _ENDS:
        return True
    if first == "ROLLBACK":  # ROLLBACK [WORK | TRANSACTION] [TO [SAVEPOINT] name]
        return "TO" not in words[1:]
    return first == "PREPARE" and words[1:2] == ["TRANSACTION"]


_ends_cached = functools.lru_cache(maxsize=1024)(_ends)


def watch(guard: SessionGuard, connection: sa.Connection) -> Callable[[], None]:
    """Refuse transaction-ending statements over ``connection`` until the outbox transaction
    ends; the function that stops watching it."""

    def check(statement: str) -> None:
        if ends_transaction(statement):
            raise guard.refuse(
                TransactionStatementError(
                    f"transaction {guard.txn_id}: the statement {statement[:80]!r} would end the "
                    "database transaction inside an outbox transaction, before the outbox "
                    "decides (a COMMIT here makes the work durable even if the transaction then "
                    "fails, a ROLLBACK undoes work its messages announce). It did not run; the "
                    "transaction is refused and rolls back. The outbox commits when the "
                    "decorated function returns (or the `with` block ends); run statements "
                    "that need their own transaction (CREATE INDEX CONCURRENTLY, VACUUM) "
                    "outside it, on a connection of their own"
                )
            )

    return statement_watch.watch(connection, check)

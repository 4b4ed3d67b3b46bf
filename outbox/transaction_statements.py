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

Savepoints are followed here too, by their statements: ``SAVEPOINT name`` marks how many sends
the transaction had made, ``ROLLBACK TO [SAVEPOINT] name`` after a send since that mark undoes
work a half message was sent in. The session's own savepoints (``session.begin_nested()``) are
seen by its events as well (:mod:`outbox.session_guard`); these statements are also what a Core
savepoint on the session's connection runs (``session.connection().begin_nested()``) and what
code writes as SQL, which no session event reports. The rollback runs (the caller asked for
it), and the transaction is refused when it ends: :class:`~outbox.errors.SendRolledBackError`.
A savepoint named in no ``SAVEPOINT`` seen (begun before the watch) counts as holding every
send. A ``SAVEPOINT`` that raised (PostgreSQL refuses every statement after an error until a
rollback) takes its mark back: a ``ROLLBACK TO`` its name then goes to an earlier savepoint of
that name, and is judged by that one's mark (``tests/outbox/test_failed_savepoint.py``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from outbox import sql_texts, statement_watch
from outbox.errors import TransactionStatementError
from outbox.savepoints import Savepoints
from outbox.session_guard import SessionGuard
from outbox.sql_texts import LEADING

#: The first keyword and up to two more.
_WORDS = re.compile(LEADING + r"([A-Za-z]+)(?:\s+([A-Za-z]+))?(?:\s+([A-Za-z]+))?")
_ENDS = frozenset(["COMMIT", "END", "ABORT"])
#: Statements at most this long have their answer remembered (:func:`ends_transaction`).
CACHED_LENGTH = 2048


#: A savepoint's name: quoted (``"..."``, MySQL's backquotes) or a bare word.
_NAME = r'("(?:[^"]|"")*"|`(?:[^`]|``)*`|[^\s;"`]+)'
_SAVEPOINT = re.compile(LEADING + r"SAVEPOINT\s+" + _NAME, re.I)
_ROLLBACK_TO = re.compile(
    LEADING + r"ROLLBACK(?:\s+(?:WORK|TRANSACTION))?\s+TO\s+(?:SAVEPOINT\s+)?" + _NAME, re.I
)
_RELEASE = re.compile(LEADING + r"RELEASE\s+(?:SAVEPOINT\s+)?" + _NAME, re.I)

#: A word that ends the transaction, anywhere (``ROLLBACK TO`` a savepoint does not).
_ANY_END = re.compile(
    r"(?<![\w$])(?:COMMIT|END|ABORT|PREPARE\s+TRANSACTION"
    r"|ROLLBACK(?!\s+(?:(?:WORK|TRANSACTION)\s+)?TO\b))(?![\w$])",
    re.I,
)
#: What a statement does to the transaction it runs in (:func:`steps`).
END = "end"
SAVEPOINT = "savepoint"
ROLLBACK_TO = "rollback to"
RELEASE = "release"

Step = tuple[str, str]


def ends_transaction(statement: str) -> bool:
    """Whether ``statement`` (any of the statements of its text) commits, rolls back or
    prepares the transaction it runs in (not a savepoint's ``ROLLBACK TO``)."""
    return any(kind == END for kind, _ in steps(statement))


def steps(statement: str) -> tuple[Step, ...]:
    """What ``statement`` does to its transaction, in order: ``(END, "")``, ``(SAVEPOINT,
    name)``, ``(ROLLBACK_TO, name)``, ``(RELEASE, name)``; nothing for any other statement. A
    name is compared as the database does: a quoted one as written, a bare one in any case.
    A text of several statements (``"UPDATE ...; COMMIT"``, which PostgreSQL's drivers run
    when it has no parameters) is read statement by statement.

    Every statement of an outbox transaction's connection is asked, and most are the same few
    texts again (SQLAlchemy caches its compiled SQL): their answers are remembered, which
    costs a dictionary lookup instead of a regular expression. Only short texts are, so the
    memory this holds stays bounded (``CACHED_LENGTH`` x 1,024 entries at most).
    """
    if len(statement) <= CACHED_LENGTH:
        return _steps_cached(statement)
    return _steps(statement)


def _steps(text: str) -> tuple[Step, ...]:
    found = tuple(s for s in map(_step, sql_texts.statements(text)) if s is not None)
    if any(kind == END for kind, _ in found) or not _maybe_hidden(text):
        return found
    return (*found, (END, ""))


def _maybe_hidden(text: str) -> bool:
    """Whether an end of the transaction may hide in ``text`` from the reading
    :func:`~outbox.sql_texts.statements` makes, in what that reading does not follow (a false
    refusal at worst): read with a backslash escaping the next character in every string
    (PostgreSQL with ``standard_conforming_strings`` off); and, where a comment holds another
    (PostgreSQL nests them), any such keyword at all."""
    if "\\" in text and any(
        (step := _step(part)) is not None and step[0] == END
        for part in sql_texts.statements(text, backslash_escapes=True)
    ):
        return True
    return sql_texts.nests_comments(text) and _ANY_END.search(text) is not None


def _step(statement: str) -> Step | None:
    found = _WORDS.match(statement)
    if found is None:
        return None
    words = [w.upper() for w in found.groups() if w]
    first = words[0]
    if first in _ENDS or (first == "PREPARE" and words[1:2] == ["TRANSACTION"]):
        return END, ""
    if first == "ROLLBACK":  # ROLLBACK [WORK | TRANSACTION] [TO [SAVEPOINT] name]
        if "TO" not in words[1:]:
            return END, ""
        return _named(ROLLBACK_TO, _ROLLBACK_TO.match(statement))
    if first == "SAVEPOINT":
        return _named(SAVEPOINT, _SAVEPOINT.match(statement))
    if first == "RELEASE":
        return _named(RELEASE, _RELEASE.match(statement))
    return None


def _named(kind: str, found: re.Match[str] | None) -> Step | None:
    if found is None:
        return None
    name = found.group(1)
    if name[0] in '"`':
        return kind, name[1:-1].replace(name[0] * 2, name[0])
    return kind, name.translate(_ASCII_LOWER)


#: How PostgreSQL folds a bare name (``downcase_identifier``): ASCII letters only, so ``É`` and
#: ``é`` are two savepoints there. ``str.lower()`` made them one, and a rollback to one could be
#: judged by the other's mark. (SQLite compares names ignoring ASCII case, quoted or not: of
#: the savepoints a name matches there, this matches some, never a newer one.)
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


_steps_cached = functools.lru_cache(maxsize=1024)(_steps)


def watch(guard: SessionGuard, connection: sa.Connection) -> Callable[[], None]:
    """Refuse transaction-ending statements over ``connection`` until the outbox transaction
    ends; the function that stops watching it."""

    savepoints = Savepoints()
    sqlite = connection.dialect.name == "sqlite"

    def check(statement: str) -> None:
        for kind, name in steps(statement):
            if kind == SAVEPOINT:
                if sqlite:
                    begin_before_savepoint(connection)
                if statement_watch.reports_failures(connection):
                    savepoints.begun(name, guard.sends)
                else:  # its failure would not be heard of: as if it may not exist
                    savepoints.begun_unconfirmed(name, guard.sends)
            elif kind == RELEASE:
                savepoints.released(name)
            elif kind == ROLLBACK_TO:
                if savepoints.rolled_back(name, guard.sends):
                    guard.broke("a savepoint was rolled back")
            else:
                _refuse(guard, statement)

    def failed(statement: str) -> None:
        # Marked before it ran, a savepoint whose statement failed does not exist (PostgreSQL
        # refuses every statement after an error until a rollback): a later ROLLBACK TO its
        # name goes to an earlier savepoint of that name, and must be judged by that one's
        # mark. (Of a text of several statements, some may have run: forgetting a savepoint
        # that exists only makes a rollback to its name count more sends as undone.)
        for kind, name in steps(statement):
            if kind == SAVEPOINT:
                savepoints.not_begun(name)

    return statement_watch.watch(connection, check, failed)


def begin_before_savepoint(connection: sa.Connection) -> None:
    """On SQLite, begin the database transaction before a savepoint that would begin it.

    Python's sqlite3 driver (and aiosqlite on it) begins a transaction only before a write; a
    ``SAVEPOINT`` run outside one begins it in SQLite itself, and its ``RELEASE`` then commits
    everything, the evidence row included, before the outbox decides: ``with
    session.begin_nested(): ...`` as the transaction's first write, then an exception, left the
    work committed and wrote a ROLLBACK op (the message lost). SQLAlchemy's recipe for SQLite
    savepoints sends ``BEGIN`` for every transaction; this sends it only here, where it is
    needed, so a transaction without savepoints keeps the driver's locking as it was.
    """
    dbapi: Any = connection.connection.dbapi_connection
    driver: Any = connection.connection.driver_connection
    if getattr(driver, "in_transaction", True) is False:
        cursor = dbapi.cursor()
        try:  # as the driver would begin it: DEFERRED, or IMMEDIATE / EXCLUSIVE if set so
            cursor.execute(f"BEGIN {getattr(driver, 'isolation_level', '') or ''}".rstrip())
        finally:
            cursor.close()


def _refuse(guard: SessionGuard, statement: str) -> None:
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

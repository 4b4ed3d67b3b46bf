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

from outbox import statement_watch
from outbox.errors import TransactionStatementError
from outbox.savepoints import Savepoints
from outbox.session_guard import SessionGuard

#: What comes before a statement's first keyword: blanks, parentheses and comments (no comment
#: body can hold its own end, and the group is possessive, so no input makes a match
#: backtrack). Shared with :mod:`outbox.other_databases`.
LEADING = r"(?:\s|\(|--[^\r\n]*[\r\n]|#[^\r\n]*[\r\n]|/\*(?:[^*]|\*(?!/))*\*/)*+"
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

#: The inside of a string whose backslash escapes the next character (possessive, and a
#: lone backslash at the end taken with it: no input makes the search try again).
_ESCAPED_INSIDE = r"(?:[^'\\]|\\.|'')*+\\?"
#: What continues a string in PostgreSQL: blanks (and ``--`` comments) holding a line break,
#: then the next piece's quote.
_CONTINUED = r"'(?:[ \t\f]|--[^\r\n]*+)*+[\r\n](?:[ \t\n\r\f]|--[^\r\n]*+[\r\n])*+'"


def _parts(plain_inside: str) -> re.Pattern[str]:
    """Where one statement of a text ends and the next begins: a ``;`` outside a string, a
    quoted name, a comment or a dollar-quoted body (those are matched whole, to be skipped);
    ``plain_inside``: the inside of a plain ``'...'`` string."""
    return re.compile(
        # PostgreSQL's E'...', where \' escapes a quote, continued as PostgreSQL continues a
        # string (its escapes kept there); not right after a name (PostgreSQL's names take
        # any non-ASCII character)
        r"(?<![\w$\x80-\U0010ffff])[Ee]'"
        + _ESCAPED_INSIDE
        + f"(?:{_CONTINUED}{_ESCAPED_INSIDE})*+"
        + r"(?:'|\Z)"
        + f"|'{plain_inside}(?:'|\\Z)"
        + r"""|"(?:[^"]|"")*(?:"|\Z)|`(?:[^`]|``)*(?:`|\Z)"""
        r"""|--[^\r\n]*|/\*(?:[^*]|\*(?!/))*(?:\*/|\Z)"""
        # a dollar quote, its tag a name's characters; not right after a name, whose $ it is
        r"|(?<![\w$\x80-\U0010ffff])"
        r"(?:\$\$.*?(?:\$\$|\Z)|\$([A-Za-z_\x80-\U0010ffff][\w\x80-\U0010ffff]*)\$.*?(?:\$\1\$|\Z))"
        r"|;",
        re.S,
    )


_PARTS = _parts(r"(?:[^']|'')*+")
#: The same with a backslash escaping the next character in plain strings too.
_PARTS_ESCAPED = _parts(_ESCAPED_INSIDE)
# Each of the above left open runs to the end of the text: PostgreSQL refuses such a text
# whole (it parses all of it before it runs any), and read so, no input makes the search try
# every opening again from each one (quadratic: 30 KB of "/* " took 4.5 s).

#: A ``CREATE`` of something with a body of statements: a trigger, a function, a procedure.
_BODY = re.compile(
    LEADING + r"CREATE\s+(?:OR\s+REPLACE\s+)?(?:(?:TEMP|TEMPORARY|CONSTRAINT)\s+)*"
    r"(?:TRIGGER|FUNCTION|PROCEDURE)\b",
    re.I,
)
#: A word that ends the transaction, anywhere (``ROLLBACK TO`` a savepoint does not).
_ANY_END = re.compile(
    r"(?<![\w$])(?:COMMIT|END|ABORT|PREPARE\s+TRANSACTION"
    r"|ROLLBACK(?!\s+(?:(?:WORK|TRANSACTION)\s+)?TO\b))(?![\w$])",
    re.I,
)
#: The bodies of statements a ``CREATE`` holds unquoted: PostgreSQL's ``BEGIN ATOMIC``, and a
#: SQLite trigger's ``BEGIN`` (a PostgreSQL trigger runs a function: ``EXECUTE FUNCTION``);
#: and the ``END`` that a statement of such a body starts with.
_ATOMIC = re.compile(r"(?<![\w$])BEGIN\s+ATOMIC(?![\w$])", re.I)
_TRIGGER = re.compile(LEADING + r"CREATE\s+(?:(?:TEMP|TEMPORARY)\s+)?TRIGGER\b", re.I)
_TRIGGER_BEGIN = re.compile(r"(?<![\w$])BEGIN(?![\w$])(?!\s*\()", re.I)
_EXECUTE = re.compile(r"(?<![\w$])EXECUTE\s+(?:FUNCTION|PROCEDURE)(?![\w$])", re.I)
_FIRST_END = re.compile(LEADING + r"END\b", re.I)
_EMPTY_BODY = re.compile(LEADING + r"END(?![\w$])", re.I)
#: Nothing but blanks and comments (after a text's last ``;``).
_BLANK = re.compile(LEADING + r"(?:--[^\r\n]*|#[^\r\n]*)?")

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
    found = tuple(s for s in map(_step, statements(text)) if s is not None)
    if any(kind == END for kind, _ in found) or not _maybe_hidden(text):
        return found
    return (*found, (END, ""))


def _maybe_hidden(text: str) -> bool:
    """Whether an end of the transaction may hide in ``text`` from the reading
    :func:`statements` makes, in what that reading does not follow (a false refusal at worst):
    read with a backslash escaping the next character in every string (PostgreSQL with
    ``standard_conforming_strings`` off); and, where a comment holds another (PostgreSQL nests
    them), any such keyword at all."""
    if "\\" in text and any(
        (step := _step(part)) is not None and step[0] == END
        for part in _statements(text, _PARTS_ESCAPED)
    ):
        return True
    return (
        "/*" in text
        and any(m[0].startswith("/*") and "/*" in m[0][2:] for m in _PARTS.finditer(text))
        and _ANY_END.search(text) is not None
    )


def statements(text: str) -> list[str]:
    """The statements of ``text``, split at each ``;`` outside a string, a quoted name, a
    comment or a dollar-quoted body. A ``CREATE`` with a body of statements it does not quote
    (PostgreSQL's ``BEGIN ATOMIC ... ; END``, a SQLite trigger's ``BEGIN ... ; END``) is one
    statement up to the first statement of the body that starts with ``END``; what follows is
    split as any text. PostgreSQL's ``E'...'`` strings are read with their backslash escapes,
    continued on the next line as it continues them (read as plain ones, ``E'\\''; COMMIT``
    hid the ``COMMIT`` in a string that never ended). Not followed here (:func:`_maybe_hidden`
    looks again): nested comments, backslash escapes in plain strings; nor MySQL's ``#``
    comments."""
    return _statements(text, _PARTS)


def _statements(text: str, pattern: re.Pattern[str]) -> list[str]:
    if ";" not in text:
        return [text]
    parts = _split(text, pattern)
    if parts and _BODY.match(text):
        parts = _body_whole(parts, pattern)
    return parts or [text]


def _split(text: str, pattern: re.Pattern[str]) -> list[str]:
    """``text`` cut at each ``;`` ``pattern`` matches alone; blank parts left out."""
    cuts = [m.end() for m in pattern.finditer(text) if m.group(0) == ";"]
    ends = [*(c - 1 for c in cuts), len(text)]
    parts = [text[a:b] for a, b in zip([0, *cuts], ends, strict=True)]
    return [p for p in parts if not _BLANK.fullmatch(p)]


def _body_whole(parts: list[str], pattern: re.Pattern[str]) -> list[str]:
    """A ``CREATE`` whose first statement begins an unquoted body, joined with the statements
    of that body up to its ``END``; the parts as they were when there is no such body or end
    (its statements then count on their own: a false refusal at worst, never a statement
    hidden in a body that is not there). The body's ``BEGIN`` is looked for outside strings,
    quoted names, comments and dollar quotes: a function's quoted body is already whole."""
    head = pattern.sub(" ", parts[0])
    atomic = _ATOMIC.search(head)
    if atomic is not None and _EMPTY_BODY.match(head, atomic.end()):
        return parts  # BEGIN ATOMIC END: its END is in this part, the next ones are not its
    unquoted = atomic is not None or (
        _TRIGGER.match(head) is not None
        and _TRIGGER_BEGIN.search(head) is not None
        and _EXECUTE.search(head) is None
    )
    if not unquoted:
        return parts
    for at in range(1, len(parts)):
        if _FIRST_END.match(parts[at]):
            return [";".join(parts[: at + 1]), *parts[at + 1 :]]
    return parts


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

"""Splitting a SQL text into its statements, as PostgreSQL and SQLite read it.

A text of several statements (``"UPDATE ...; COMMIT"``) runs whole on PostgreSQL's drivers, so
what an outbox transaction asks of each statement - does it end the transaction
(:mod:`outbox.transaction_statements`), does it write (:mod:`outbox.other_databases`) - is
asked of every statement of the text. The text is cut at each ``;`` outside a string, a quoted
name, a comment or a dollar-quoted body, read as PostgreSQL's lexer reads them (``E'...'``
escapes, continued strings, names and dollar-quote tags with non-ASCII characters, a carriage
return ending a ``--`` comment) - where it reads otherwise, the reading errs towards seeing a
statement boundary, never towards hiding one. Python's ``sqlite3`` runs only a text's first
statement, so there only the first statement's first keyword matters.
"""

from __future__ import annotations

import re

#: What comes before a statement's first keyword: blanks, parentheses and comments (no comment
#: body can hold its own end, and the group is possessive, so no input makes a match
#: backtrack). Also :mod:`outbox.transaction_statements`' and :mod:`outbox.other_databases`'.
LEADING = r"(?:\s|\(|--[^\r\n]*[\r\n]|#[^\r\n]*[\r\n]|/\*(?:[^*]|\*(?!/))*\*/)*+"

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
#: The bodies of statements a ``CREATE`` holds unquoted: PostgreSQL's ``BEGIN ATOMIC``, and a
#: SQLite trigger's ``BEGIN`` (a PostgreSQL trigger runs a function: ``EXECUTE FUNCTION``);
#: and the ``END`` that a statement of such a body starts with.
_ATOMIC = re.compile(r"(?<![\w$])BEGIN\s+ATOMIC(?![\w$])", re.I)
_TRIGGER = re.compile(LEADING + r"CREATE\s+(?:(?:TEMP|TEMPORARY)\s+)?TRIGGER\b", re.I)
_TRIGGER_BEGIN = re.compile(r"(?<![\w$])BEGIN(?![\w$])(?!\s*\()", re.I)
_EXECUTE = re.compile(r"(?<![\w$])EXECUTE\s+(?:FUNCTION|PROCEDURE)(?![\w$])", re.I)
_BODY_END = re.compile(LEADING + r"END(?![\w$])", re.I)
#: Nothing but blanks and comments (after a text's last ``;``).
_BLANK = re.compile(LEADING + r"(?:--[^\r\n]*|#[^\r\n]*)?")


def statements(text: str, *, backslash_escapes: bool = False) -> list[str]:
    """The statements of ``text``, split at each ``;`` outside a string, a quoted name, a
    comment or a dollar-quoted body. A ``CREATE`` with a body of statements it does not quote
    (PostgreSQL's ``BEGIN ATOMIC ... ; END``, a SQLite trigger's ``BEGIN ... ; END``) is one
    statement up to the first statement of the body that starts with ``END``; what follows is
    split as any text. PostgreSQL's ``E'...'`` strings are read with their backslash escapes,
    continued on the next line as it continues them (read as plain ones, ``E'\\''; COMMIT``
    hid the ``COMMIT`` in a string that never ended). Not followed: nested comments
    (:func:`nests_comments` tells where they may be); nor MySQL's ``#`` comments.

    ``backslash_escapes``: read a backslash in a plain string as escaping the next character
    too (PostgreSQL with ``standard_conforming_strings`` off)."""
    pattern = _PARTS_ESCAPED if backslash_escapes else _PARTS
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
    if atomic is not None and _BODY_END.match(head, atomic.end()):
        return parts  # BEGIN ATOMIC END: its END is in this part, the next ones are not its
    unquoted = atomic is not None or (
        _TRIGGER.match(head) is not None
        and _TRIGGER_BEGIN.search(head) is not None
        and _EXECUTE.search(head) is None
    )
    if not unquoted:
        return parts
    for at in range(1, len(parts)):
        if _BODY_END.match(parts[at]):
            return [";".join(parts[: at + 1]), *parts[at + 1 :]]
    return parts


def nests_comments(text: str) -> bool:
    """Whether a comment in ``text`` opens another before it ends: PostgreSQL nests them, and
    :func:`statements` reads such a comment as ending at its first ``*/``."""
    return "/*" in text and any(
        m[0].startswith("/*") and "/*" in m[0][2:] for m in _PARTS.finditer(text)
    )

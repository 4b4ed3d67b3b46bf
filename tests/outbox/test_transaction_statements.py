"""Which statements end the database transaction they run in
(:func:`outbox.transaction_statements.ends_transaction`): refused inside an outbox transaction,
while what ``begin_nested()`` runs, and every other statement, goes through; which begin, release
or roll back to a savepoint, and when that rollback undoes a send. The end-to-end cases are
scenarios of ``tests/outbox/test_session_misuse.py``, ``test_connection_misuse.py`` and the
asyncio twin of the first."""

from __future__ import annotations

import pytest

from outbox.savepoints import Savepoints
from outbox.transaction_statements import (
    CACHED_LENGTH,
    END,
    RELEASE,
    ROLLBACK_TO,
    SAVEPOINT,
    ends_transaction,
    steps,
)

ENDS = [
    "COMMIT",
    "commit work",
    "COMMIT TRANSACTION;",
    "  END",
    "END TRANSACTION",
    "ABORT",
    "ROLLBACK",
    "rollback transaction",
    "/* a hint */ COMMIT",
    "-- a comment\nROLLBACK",
    "PREPARE TRANSACTION 'outbox-1'",
    "COMMIT PREPARED 'outbox-1'",
    # a text of several statements: any of them
    "UPDATE orders SET amount = 2; COMMIT",
    "SELECT 1;rollback",
    "UPDATE t SET a = '--'; /* ; */ END;",
    'SELECT "a;b"; ABORT',
    "CREATE INDEX ix ON orders (amount); COMMIT",  # a CREATE with no body is split too
    # PostgreSQL's E'...' escapes a quote with a backslash: read plain, the string never ended
    "SELECT E'\\''; COMMIT; SELECT 'x'",
    "SELECT e'a\\\\'; COMMIT",  # an escaped backslash, then the string's end
    "SELECT 'C:\\'; COMMIT",  # a standard string: a backslash is a character
    # a $ inside a name (PostgreSQL allows them) begins no dollar quote
    "SELECT a$b$ FROM t; COMMIT; SELECT $b$x$b$",
    "SELECT price$$ FROM t; COMMIT; SELECT $$x$$",
    # PostgreSQL's names take any non-ASCII character, so do its dollar quotes' tags
    "SELECT 1 AS x€$a$; COMMIT; SELECT 1 AS y€$a$",
    "SELECT $é$'$é$; COMMIT; --'",
    "SELECT €E'\\'; COMMIT; --'",  # the name €E, then a plain string (a typed literal)
    # a carriage return ends a -- comment in PostgreSQL
    "SELECT 1 --x\r; COMMIT",
    "--x\rCOMMIT",
    # an E-string continued on the next line keeps its escapes there
    "SELECT E'a'\n'\\''; COMMIT; --'",
    # a session with standard_conforming_strings off reads a backslash as an escape
    "SELECT '\\''; COMMIT; --'",
    # PostgreSQL nests comments
    "/* /* */ */ COMMIT",
    "SELECT 1 /* /* */ ' */; COMMIT; --'",
    # a CREATE's body is one statement up to its END; what follows is not part of it
    "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'select 1'; COMMIT",
    "CREATE TRIGGER t AFTER INSERT ON orders BEGIN UPDATE totals SET n = n + 1; END; COMMIT",
    "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'BEGIN'; COMMIT",
    # a body in quotes or a dollar quote, or a name "begin", begins no unquoted body
    "CREATE FUNCTION f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$; END",
    "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'BEGIN'; END",
    "CREATE FUNCTION begin() RETURNS int LANGUAGE sql AS 'select 1'; END",
    "CREATE TRIGGER begin BEFORE INSERT ON t FOR EACH ROW EXECUTE FUNCTION f(); END",
    # a continued E-string read as PostgreSQL reads it, a standard string's backslash beside it
    "SELECT E'a'\n'\\'', 'C:\\'; COMMIT; --'",
    "SELECT E'a' -- a comment before the line break\n'\\''; COMMIT; --'",
    # an empty BEGIN ATOMIC END body: what follows it is not part of it
    "CREATE PROCEDURE p() LANGUAGE sql BEGIN ATOMIC END; COMMIT; "
    "CREATE FUNCTION g() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; END",
    "CREATE FUNCTION f() RETURNS void LANGUAGE sql BEGIN ATOMIC /* empty */ END; ROLLBACK",
]
GOES_THROUGH = [
    "ROLLBACK TO SAVEPOINT sa_savepoint_1",
    "ROLLBACK TRANSACTION TO sp1",
    "rollback work to savepoint sp1",
    "RELEASE SAVEPOINT sa_savepoint_1",
    "SAVEPOINT sa_savepoint_1",
    "BEGIN",
    "SELECT 1",
    "INSERT INTO orders (id) VALUES ('commit')",
    "UPDATE t SET state = 'END'",
    "PREPARE get_order AS SELECT 1",
    "DO $$ BEGIN PERFORM 1; END $$",
    "",
    # a semicolon inside a string, a quoted name, a comment or a dollar-quoted body
    "INSERT INTO t VALUES ('x; commit')",
    "UPDATE t SET s = 'it''s; COMMIT'",
    "UPDATE t SET s = E'it\\'s; COMMIT'",
    "SELECT name'; COMMIT'",  # no E-string: a plain string after a name ending in e
    'SELECT 1 AS "x; commit"',
    "SELECT 1 -- ; commit\n",
    "SELECT 1 /* ; ROLLBACK */",
    "SELECT $tag$ ; commit $tag$; SELECT 2",
    "UPDATE t SET a = 1; ",
    "SELECT 1; ROLLBACK TO SAVEPOINT sp1",
    # a CREATE is one statement: a trigger's or a function's body is not several
    "CREATE TRIGGER t AFTER INSERT ON orders BEGIN UPDATE totals SET n = n + 1; END;",
    "CREATE FUNCTION one() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; END",
    "CREATE TRIGGER t AFTER INSERT ON o BEGIN INSERT INTO log VALUES ('C:\\tmp'); END",
    "CREATE FUNCTION f() RETURNS text LANGUAGE sql BEGIN ATOMIC "
    "SELECT regexp_replace('a1', '\\d', ''); END",
    "CREATE FUNCTION f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$",
    "SELECT E'a'\n'b; COMMIT'",  # one string, continued on the next line
    "CREATE PROCEDURE p() LANGUAGE sql BEGIN ATOMIC END",
    "CREATE FUNCTION g() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; END; SELECT 2",
    # no nested comment: a /* in a string is none
    "SELECT CASE WHEN path GLOB '/srv/*/*.log' THEN 1 END FROM files",
    "SELECT commit, path FROM builds WHERE path LIKE '/src/*/*'",
]


@pytest.mark.parametrize("statement", ENDS)
def test_statements_that_end_the_transaction(statement: str) -> None:
    assert ends_transaction(statement)


@pytest.mark.parametrize("statement", GOES_THROUGH)
def test_statements_that_do_not(statement: str) -> None:
    assert not ends_transaction(statement)


def test_a_remembered_answer_is_the_answer_and_long_texts_are_read_each_time() -> None:
    for statement in ENDS + GOES_THROUGH:  # asked twice: the second answer is remembered
        assert ends_transaction(statement) == ends_transaction(statement) == (statement in ENDS)
    comment = "/*" + "x" * CACHED_LENGTH + "*/ "
    assert ends_transaction(comment + "COMMIT")
    assert not ends_transaction(comment + "SELECT 1")
    select = "SELECT " + ", ".join(["1"] * CACHED_LENGTH)
    assert len(select) > CACHED_LENGTH and not ends_transaction(select)


@pytest.mark.parametrize(
    ("statement", "expected"),
    [
        ("SAVEPOINT sa_savepoint_1", (SAVEPOINT, "sa_savepoint_1")),
        ("savepoint Held", (SAVEPOINT, "held")),  # a bare name: any case
        ('SAVEPOINT "Held"', (SAVEPOINT, "Held")),  # a quoted one: as written
        # PostgreSQL folds ASCII letters only: "É" and "é" are two savepoints there
        ("SAVEPOINT Étape_É", (SAVEPOINT, "Étape_É")),
        ("ROLLBACK TO SAVEPOINT ÉTAPE_É", (ROLLBACK_TO, "Étape_É")),
        ('SAVEPOINT "say ""hi"""', (SAVEPOINT, 'say "hi"')),
        ("SAVEPOINT `my sp`", (SAVEPOINT, "my sp")),
        ("/* hint */ SAVEPOINT sp1;", (SAVEPOINT, "sp1")),
        ("ROLLBACK TO SAVEPOINT sa_savepoint_1", (ROLLBACK_TO, "sa_savepoint_1")),
        ("rollback work to sp1", (ROLLBACK_TO, "sp1")),
        ("ROLLBACK TRANSACTION TO SAVEPOINT SP1", (ROLLBACK_TO, "sp1")),
        ("RELEASE SAVEPOINT sa_savepoint_1", (RELEASE, "sa_savepoint_1")),
        ("release sp1", (RELEASE, "sp1")),
        ("ROLLBACK", (END, "")),
        ("COMMIT", (END, "")),
        ("SELECT 'SAVEPOINT x'", None),
        ("UPDATE t SET a = 1", None),
    ],
)
def test_what_a_statement_does_to_its_transaction(
    statement: str, expected: tuple[str, str] | None
) -> None:
    assert steps(statement) == (() if expected is None else (expected,))


def test_a_rollback_to_a_savepoint_undoes_the_sends_made_since_it_began() -> None:
    marks = Savepoints()
    marks.begun("a", sends=0)
    marks.begun("b", sends=1)
    assert not marks.rolled_back("b", sends=1)  # nothing sent since b
    assert marks.rolled_back("b", sends=2)  # b stays: it can be rolled back to again
    assert marks.rolled_back("b", sends=2)
    assert marks.rolled_back("a", sends=2)  # and b, begun after a, is gone with it
    assert marks.rolled_back("b", sends=2)  # a name not known: begun before, holds every send
    marks.begun("c", sends=2)
    marks.released("a")  # a and everything after it
    assert marks.rolled_back("c", sends=2)  # unknown again: counts every send
    assert not Savepoints().rolled_back("never", sends=0)  # nothing sent at all
    again = Savepoints()
    again.begun("x", sends=0)
    again.begun("x", sends=3)  # the same name again: the newer one
    assert not again.rolled_back("x", sends=3)
    again.released("x")
    assert again.rolled_back("x", sends=3)  # the older x, begun before the three sends


def test_a_savepoint_whose_statement_failed_is_forgotten_alone() -> None:
    """Its statement failed (PostgreSQL's aborted transaction): a rollback to its name goes to
    the savepoint of that name before it, and is judged by that one's mark."""
    marks = Savepoints()
    marks.begun("attempt", sends=0)
    marks.begun("other", sends=0)
    marks.begun("attempt", sends=1)
    marks.not_begun("attempt")
    assert marks.rolled_back("attempt", sends=1)  # the first attempt, before the send
    marks.not_begun("never")  # a name not marked: nothing to forget
    assert marks.rolled_back("attempt", sends=1)


def test_a_savepoint_whose_failure_would_go_unheard_is_marked_as_its_namesake() -> None:
    """Where a failed ``SAVEPOINT`` is not reported (``statement_watch.reports_failures``), a
    rollback to its name may reach the savepoint of that name before it: judged by that one's
    mark, it may be refused though nothing was undone, never let through when a send was."""
    marks = Savepoints()
    marks.begun("attempt", sends=0)
    marks.begun_unconfirmed("attempt", sends=1)
    assert marks.rolled_back("attempt", sends=1)  # the first attempt's mark
    fresh = Savepoints()
    fresh.begun_unconfirmed("attempt", sends=2)  # no namesake: its own
    assert not fresh.rolled_back("attempt", sends=2)

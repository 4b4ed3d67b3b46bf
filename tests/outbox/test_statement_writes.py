"""Which statements over a second database's connection count as writes
(:func:`outbox.other_databases.writes`): a read runs, anything that may write is refused, so a
statement the classifier cannot place counts as a write."""

from __future__ import annotations

import time

import pytest

from outbox.other_databases import writes

READS = [
    "SELECT 1",
    "  select * from ledger_accounts",
    "(SELECT 1) UNION (SELECT 2)",
    "/* a hint */ SELECT 1",
    "-- a comment\nSELECT 1",
    "# MySQL's comment\nSELECT 1",
    "WITH a AS (SELECT 1) SELECT * FROM a",
    "WITH a AS (SELECT id FROM t) SELECT * FROM a FOR UPDATE",
    "SELECT id FROM t FOR NO KEY UPDATE",
    "EXPLAIN SELECT 1",
    "SHOW search_path",
    "SAVEPOINT sa_savepoint_1",
    "RELEASE SAVEPOINT sa_savepoint_1",
    "ROLLBACK TO SAVEPOINT sa_savepoint_1",
    "SAVE TRANSACTION sp1",
    "BEGIN",
    "BEGIN IMMEDIATE;",
    "SET LOCAL statement_timeout = 1000",
    "PRAGMA foreign_keys",
    "select txid_current_if_assigned()",
    # a text of several statements: every one reads
    "SELECT 1;",
    "SELECT 1; SELECT 'a; DELETE FROM t' -- done",
    "SELECT 1; -- done",
]
WRITES = [
    "SELECT 1; DELETE FROM t",  # any statement of a text that writes
    "SHOW search_path; /* ; */ UPDATE t SET a = 1",
    "INSERT INTO t VALUES (1)",
    "update t set a = 1",
    "DELETE FROM t",
    "MERGE INTO t USING s ON (t.id = s.id) WHEN MATCHED THEN DELETE",
    "WITH gone AS (DELETE FROM t RETURNING *) SELECT * FROM gone",
    "SELECT * INTO t2 FROM t",
    "EXPLAIN ANALYZE INSERT INTO t VALUES (1)",
    "BEGIN pkg.proc(:x); END;",
    "CREATE TABLE x (a int)",
    "TRUNCATE t",
    "CALL proc()",
    "",
    "/* only a comment */",
]


@pytest.mark.parametrize("statement", READS)
def test_a_read_is_not_a_write(statement: str) -> None:
    assert not writes(statement)


@pytest.mark.parametrize("statement", WRITES)
def test_anything_that_may_write_is_one(statement: str) -> None:
    assert writes(statement)


def test_no_statement_makes_the_classifier_backtrack() -> None:
    # Leading comments followed by no keyword: with a backtracking pattern each comment
    # doubled the work (0.3 ms at 12, 4.8 ms at 16; minutes at 30)
    pathological = "/* a */" * 40 + "/"
    started = time.perf_counter()
    assert writes(pathological)
    assert time.perf_counter() - started < 0.05

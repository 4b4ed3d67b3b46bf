"""Which statements end the database transaction they run in
(:func:`outbox.transaction_statements.ends_transaction`): refused inside an outbox transaction,
while what ``begin_nested()`` runs, and every other statement, goes through. The end-to-end
cases are scenarios of ``tests/outbox/test_session_misuse.py`` and its asyncio twin."""

from __future__ import annotations

import pytest

from outbox.transaction_statements import CACHED_LENGTH, ends_transaction

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

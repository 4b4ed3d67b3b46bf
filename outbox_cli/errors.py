"""Errors of the command line, each carrying the exit code it ends the process with.

::

    OutboxError                     (outbox.errors)
    └── CommandError                exit 1: the command ran and found a problem
        ├── UsageError              exit 2: bad usage, an invalid setting, a missing extra
        ├── UnreachableError        exit 3: Kafka or the database did not answer
        ├── NotFoundError           exit 4: no such transaction
        └── RefusedError            exit 5: the operation does not apply (e.g. resume twice)

Library errors are mapped in :func:`outbox_cli.main.exit_code_for`: a ``ConfigurationError``
is a usage error (2), any other ``OutboxError`` a problem (1).
"""

from __future__ import annotations

from outbox.errors import OutboxError

OK = 0
PROBLEM = 1
USAGE = 2
UNREACHABLE = 3
NOT_FOUND = 4
REFUSED = 5

#: The table printed by ``kafka-outbox --help`` and docs/cli.md.
EXIT_CODES = (
    (OK, "ok"),
    (
        PROBLEM,
        "the command ran and found a problem (audit violations, given-up transactions in "
        "`status`, internal topics missing or mismatched, a failed Kafka operation)",
    ),
    (USAGE, "bad usage or an invalid setting (the message names the key and the value)"),
    (UNREACHABLE, "cannot reach Kafka or the database"),
    (NOT_FOUND, "not found (an unknown transaction id)"),
    (
        REFUSED,
        "refused (resume of a transaction that is not given up, or already resumed, or resumed "
        "by another resume that started meanwhile)",
    ),
)


class CommandError(OutboxError):
    """Raised when a command ran and found a problem; exits 1."""

    exit_code = PROBLEM


class UsageError(CommandError):
    """Raised for bad arguments or a missing optional part; exits 2."""

    exit_code = USAGE


class UnreachableError(CommandError):
    """Raised when Kafka or the database does not answer in time; exits 3."""

    exit_code = UNREACHABLE


class NotFoundError(CommandError):
    """Raised when the transaction asked about left no record; exits 4."""

    exit_code = NOT_FOUND


class RefusedError(CommandError):
    """Raised when an operation does not apply to the transaction's state; exits 5."""

    exit_code = REFUSED

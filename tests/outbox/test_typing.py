"""The public API type-checks the way applications call it (``mypy --strict``), in both forms:
a caller's ``await place_order("o1")`` with the session injected, ``async with
producer.transaction(...)`` giving an AsyncOutboxTransaction, ``await outbox.send(...)``."""

from __future__ import annotations

from pathlib import Path

from mypy import api

USAGE = Path(__file__).parent / "typing" / "usage.py"


def test_the_public_api_type_checks_as_applications_call_it() -> None:
    out, err, status = api.run(
        ["--strict", "--no-incremental", "--follow-imports=silent", str(USAGE)]
    )
    assert status == 0, out + err

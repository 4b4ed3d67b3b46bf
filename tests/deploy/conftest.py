"""Lines the deploy tests want in every CI log, printed in the session's closing summary."""

from __future__ import annotations

import pytest

#: Appended to by the tests; shown whether or not pytest captures output (-s or not).
REPORT: list[str] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if REPORT:
        terminalreporter.section("kafka-outbox service image")
        for line in REPORT:
            terminalreporter.write_line(line)

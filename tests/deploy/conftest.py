"""Lines the deploy tests want in every CI log, printed in the session's closing summary; and
promtool, which the rules tests need."""

from __future__ import annotations

import shutil

import pytest

from outbox.testing import HarnessSettings

#: Appended to by the tests; shown whether or not pytest captures output (-s or not).
REPORT: list[str] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if REPORT:
        terminalreporter.section("kafka-outbox service image")
        for line in REPORT:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def promtool(harness_settings: HarnessSettings) -> str:
    """Prometheus's promtool (Debian's `prometheus` package). Missing, it fails the test under
    CI=true, where scripts/install-system-packages.sh must have installed it, and skips it
    elsewhere with the reason, as the harness does with a service that cannot start."""
    path = shutil.which("promtool")
    if path is None:
        message = (
            "promtool is not installed (scripts/install-system-packages.sh installs Debian's "
            "prometheus package, which has it)"
        )
        if harness_settings.ci:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return path

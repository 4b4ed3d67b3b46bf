"""A pytest session ended by SIGTERM still stops what it started (the plugin's handler)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

SESSION = textwrap.dedent(
    """
    import atexit, pathlib, time
    import pytest

    MARK = pathlib.Path({mark!r})

    @pytest.fixture(scope="session")
    def service():
        (MARK.parent / "started").write_text("yes")
        yield
        MARK.write_text("torn down")  # what a service fixture's teardown does

    def test_hangs(service):
        time.sleep(120)
    """
)


def test_a_session_ended_by_sigterm_tears_its_services_down(tmp_path: Path) -> None:
    mark = tmp_path / "teardown"
    test_file = tmp_path / "test_hang.py"
    test_file.write_text(SESSION.format(mark=str(mark)))
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"),
            *("-p", "outbox.testing.pytest_plugin", str(test_file)),  # the plugin, opted in
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "started").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert mark.exists(), out  # without the handler SIGTERM kills it before any teardown
    assert "KeyboardInterrupt" in out
    assert proc.returncode != 0

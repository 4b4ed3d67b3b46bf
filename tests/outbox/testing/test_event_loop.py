"""The session's asyncio code runs on the loop OUTBOX_TEST_EVENT_LOOP names (``make test-uvloop``
runs the asyncio suites on uvloop): a setting that did not take would walk the wrong loop."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from outbox.testing import HarnessSettings
from outbox.testing.event_loop import running_loop_name

USER_TEST = """\
import asyncio

def test_loop():
    async def module():
        return type(asyncio.get_running_loop()).__module__
    print("LOOP", asyncio.run(module()))
"""


def test_this_session_runs_on_the_loop_its_settings_name() -> None:
    assert running_loop_name() == HarnessSettings.from_env().event_loop


def run_pytest(project: Path, loop: str, **more: str) -> subprocess.CompletedProcess[str]:
    """A user's project (none of this repository's settings) with the plugin and the variable."""
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "test_user.py").write_text(USER_TEST)
    env = {**os.environ, "OUTBOX_TEST_EVENT_LOOP": loop, **more}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-p",
            "outbox.testing.pytest_plugin",
            "-s",
            "-q",
        ],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def test_uvloop_is_the_loop_asyncio_run_makes_when_asked_for(tmp_path: Path) -> None:
    done = run_pytest(tmp_path, "uvloop")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "LOOP uvloop" in done.stdout


def test_an_unknown_loop_stops_the_session_naming_the_choices(tmp_path: Path) -> None:
    done = run_pytest(tmp_path, "trio")
    assert done.returncode != 0
    assert "OUTBOX_TEST_EVENT_LOOP='trio' is not an event loop" in done.stderr + done.stdout


def test_a_mistyped_provider_does_not_stop_a_session_that_starts_no_service(
    tmp_path: Path,
) -> None:
    done = run_pytest(tmp_path, "asyncio", OUTBOX_TEST_PROVIDER="kubernetes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "LOOP asyncio" in done.stdout

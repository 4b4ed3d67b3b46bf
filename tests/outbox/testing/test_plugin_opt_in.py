"""Installing kafka-outbox loads nothing into a user's test run: the real-service fixtures (and
their SIGTERM handler, and the harness that may install packages) come only when asked for."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def fixtures(project: Path, *extra: str) -> str:
    """``pytest --fixtures`` in a project of its own (none of this repository's settings)."""
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "test_user.py").write_text("def test_nothing():\n    pass\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--fixtures", *extra],
        cwd=project,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_real_service_fixtures_are_opt_in(tmp_path: Path) -> None:
    assert "kafka_bootstrap" not in fixtures(tmp_path)
    assert "kafka_bootstrap" in fixtures(tmp_path, "-p", "outbox.testing.pytest_plugin")

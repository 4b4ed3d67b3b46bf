"""A wall clock 10 minutes off for a child process: ``tests/checker/skewed_clock.c``, an
``LD_PRELOAD`` shim that shifts ``CLOCK_REALTIME`` (not the monotonic clock), as on a host whose
clock is wrong. Shared by the checker's and the relay's clock tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from outbox.testing import HarnessSettings

#: How far the shim moves a process's wall clock (s): ahead.
SKEW_S = 600
SOURCE = Path(__file__).parent / "checker" / "skewed_clock.c"


@pytest.fixture(scope="session")
def skewed_clock(
    tmp_path_factory: pytest.TempPathFactory, harness_settings: HarnessSettings
) -> Path:
    """The shim, built with gcc."""
    gcc = shutil.which("gcc")
    if gcc is None:
        message = "gcc is not installed (it builds tests/checker/skewed_clock.c); run `make setup`"
        if harness_settings.ci:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    built = tmp_path_factory.mktemp("skewed-clock") / "skewed_clock.so"
    subprocess.run(
        [gcc, "-shared", "-fPIC", "-O2", "-o", str(built), str(SOURCE), "-ldl"], check=True
    )
    return built


def skewed_env(shim: Path) -> dict[str, str]:
    """What a child process's environment needs to run on the skewed clock."""
    return {"LD_PRELOAD": str(shim), "SKEWED_CLOCK_SECONDS": str(SKEW_S)}

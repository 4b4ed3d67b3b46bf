"""A new user's path: the built wheel, installed into a fresh virtualenv outside the checkout,
runs the README's quickstart (its Python, ``kafka-outbox relay`` and ``checker``) against the
test broker. Catches what a checkout hides: a module or data file left out of the wheel (the
migrations, ``py.typed``), an import of something only the dev install has, a console script
that does not start."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.docs.test_readme import run_quickstart

pytestmark = [pytest.mark.integration, pytest.mark.processes]

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str | Path, cwd: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"{args}: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"


def test_the_wheel_in_a_fresh_virtualenv_runs_the_quickstart(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    dist = tmp_path / "dist"
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", dist, ROOT, cwd=tmp_path)
    [wheel] = dist.glob("kafka_outbox-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"outbox/py.typed", "outbox/migrations/script.py.mako"} <= names
    assert any(n.startswith("outbox/migrations/versions/0001") for n in names)
    assert not any(n.startswith(("tests/", "bench/", "examples/")) for n in names)
    venv = tmp_path / "fresh-venv"  # outside the checkout, nothing of it on the path
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    # the extras a producer service and its relay and checker need; the same versions as CI's
    run(
        venv / "bin" / "pip",
        "install",
        "-q",
        "-c",
        ROOT / "constraints.txt",
        f"{wheel}[services]",
        cwd=tmp_path,
    )
    work = tmp_path / "app"
    work.mkdir()
    run_quickstart(kafka_bootstrap, work, venv / "bin", isolated=True)

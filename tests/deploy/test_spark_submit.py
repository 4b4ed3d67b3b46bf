"""deploy/spark: the submit scripts' exit-code contract (the audit's: 0 clean, 1 violations, 2
usage or configuration, 3 could not run) where the script or the driver's Python, not the audit,
finds the problem. A missing piece must never exit 1, which reads as "violations found".

The full run on a standalone cluster is tests/checker/audit/test_on_standalone_cluster.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from checker.audit.cli import EXIT_USAGE
from outbox.testing import HarnessSettings

SPARK = Path(__file__).resolve().parents[2] / "deploy" / "spark"
SUBMIT = SPARK / "submit-standalone.sh"
BASH = shutil.which("bash") or "/bin/bash"  # found before a test narrows PATH


def _bin_with(tmp_path: Path, *tools: str) -> str:
    """A PATH of only ``tools`` (coreutils the script needs): no spark-submit on it."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in tools:
        found = shutil.which(tool)
        assert found is not None, tool
        (folder / tool).symlink_to(found)
    return str(folder)


def _submit(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BASH, str(SUBMIT), "--help"], env=env, capture_output=True, text=True, timeout=60
    )


def test_submit_standalone_exits_2_naming_spark_master_when_it_is_unset() -> None:
    env = {k: v for k, v in os.environ.items() if k != "SPARK_MASTER"}
    done = _submit(env)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert "set SPARK_MASTER" in done.stderr


def test_submit_standalone_exits_2_naming_the_folder_without_the_kafka_source(
    tmp_path: Path,
) -> None:
    done = _submit({**os.environ, "SPARK_MASTER": "spark://x:7077", "JARS_DIR": str(tmp_path)})
    assert done.returncode == EXIT_USAGE, done.stderr
    assert f"no spark-sql-kafka jar in {tmp_path}" in done.stderr


def test_submit_standalone_exits_2_when_spark_submit_is_not_on_path(
    tmp_path: Path, harness_settings: HarnessSettings
) -> None:
    jars = harness_settings.spark_jars_dir
    if not any(jars.glob("spark-sql-kafka-*.jar")):
        pytest.skip(f"no spark-sql-kafka jar in {jars}; run `make jars`")
    env = {
        **os.environ,
        "SPARK_MASTER": "spark://x:7077",
        "JARS_DIR": str(jars),
        "PATH": _bin_with(tmp_path, "dirname", "paste"),
    }
    done = _submit(env)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert "no spark-submit on PATH" in done.stderr


def test_the_job_exits_2_naming_pyspark_python_when_its_python_lacks_the_package() -> None:
    # -S -I: no site-packages, no PYTHONPATH - a Python without kafka-outbox installed
    done = subprocess.run(
        [sys.executable, "-S", "-I", str(SPARK / "audit_job.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == EXIT_USAGE, done.stderr
    assert "cannot import the audit" in done.stderr and "PYSPARK_PYTHON" in done.stderr

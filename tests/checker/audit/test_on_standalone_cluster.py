"""The audit submitted to a Spark standalone cluster with ``deploy/spark/submit-standalone.sh``
finds, row for row, what the ``local[2]`` run finds on the same seeded topics and evidence.

The cluster (a master and two one-core workers, tests/spark_standalone.py) runs the executors
in JVMs of their own, so the Kafka source and the PostgreSQL driver reach them only through the
script's ``--jars``; the driver runs here (client mode) in this test's Python.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from checker.audit.cli import EXIT_UNAVAILABLE, EXIT_VIOLATIONS
from checker.audit.findings import FINDINGS
from checker.audit.session import APP_NAME
from outbox.testing import HarnessSettings
from tests.checker.audit.conftest import SeededAudit
from tests.spark_standalone import StandaloneCluster

CHECKOUT = Path(__file__).resolve().parents[3]
SUBMIT = CHECKOUT / "deploy" / "spark" / "submit-standalone.sh"
#: Each executor's heap: within a worker's 768 MiB, and plenty for the seeded topics.
EXECUTOR_MEMORY = "512m"


def _plain(value: Any) -> Any:
    """A Spark value as a hashable Python value (Rows and lists as tuples, bytes as bytes)."""
    if hasattr(value, "asDict"):
        return tuple((k, _plain(v)) for k, v in value.asDict().items())
    if isinstance(value, list | tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def finding_differences(
    local: Mapping[str, Sequence[Any]], cluster: Mapping[str, Sequence[Any]]
) -> list[str]:
    """One line per finding whose rows differ between the two runs (compared as multisets of
    whole rows, every column), naming the rows only one run has."""
    differences = []
    for name in sorted(set(local) | set(cluster)):
        ours = Counter(_plain(r) for r in local.get(name, ()))
        theirs = Counter(_plain(r) for r in cluster.get(name, ()))
        if ours != theirs:
            differences.append(
                f"{name}: only in local[2]: {sorted(map(repr, (ours - theirs).elements()))}; "
                f"only on the cluster: {sorted(map(repr, (theirs - ours).elements()))}"
            )
    return differences


def submit(
    cluster: StandaloneCluster, jars_dir: Path, argv: list[str]
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run the submit script as an operator would: spark-submit on PATH (the venv's), the
    driver's Python named by PYSPARK_PYTHON. Returns the finished process and seconds taken.

    spark-submit copies the driver Python's stdout *and stderr* to its own stdout, so the
    audit's messages (its summary, or "audit: could not run: ...") are on stdout; spark-submit's
    stderr holds only the JVM's log."""
    env = {
        **cluster.env(),
        "SPARK_MASTER": cluster.url,
        "EXECUTOR_MEMORY": EXECUTOR_MEMORY,
        "SHUFFLE_PARTITIONS": "4",  # as the local[2] session's
        "JARS_DIR": str(jars_dir),
        "PYSPARK_PYTHON": sys.executable,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        # the checkout under test, whether or not it is the one installed
        "PYTHONPATH": os.pathsep.join(filter(None, [str(CHECKOUT), os.environ.get("PYTHONPATH")])),
    }
    started = time.monotonic()
    done = subprocess.run(
        [str(SUBMIT), *argv], env=env, capture_output=True, text=True, timeout=900, check=False
    )
    return done, time.monotonic() - started


def application_of(cluster: StandaloneCluster, done: subprocess.CompletedProcess[str]) -> str:
    """The id of the application a submission ran, as its driver logged it, once the master
    lists it completed (up to 30 s: in client mode the driver tells the master it is done
    without waiting, so it may be listed a moment after spark-submit exits)."""
    found = re.findall(r"Connected to Spark cluster with app ID (\S+)", done.stderr)
    assert len(found) == 1, f"the driver logged {found} as its application; {outputs(done)}"
    deadline = time.monotonic() + 30
    while not (listed := [a for a in cluster.status()["completedapps"] if a["id"] == found[0]]):
        assert time.monotonic() < deadline, f"the master does not list {found[0]} as completed"
        time.sleep(0.5)
    assert listed[0]["name"] == APP_NAME, listed
    return str(found[0])


def outputs(done: subprocess.CompletedProcess[str]) -> str:
    """The ends of what a submission printed: the audit's own lines first."""
    return (
        f"the audit's output (spark-submit's stdout) ends:\n{done.stdout[-6000:]}\n"
        f"spark-submit's stderr (the JVM's log) ends:\n{done.stderr[-3000:]}"
    )


@pytest.mark.integration
@pytest.mark.cluster
# Seeding and the local[2] audit (its setup), the cluster's start and the submission: 351 s on
# the 2-core machine at load 13-20, past the suite's 600 s at load 60-90 (other suites running).
@pytest.mark.timeout(1800)
def test_the_audit_on_a_standalone_cluster_finds_what_local_2_finds(
    seeded_audit: SeededAudit,
    spark_standalone: StandaloneCluster,
    spark: Any,
    harness_settings: HarnessSettings,
    tmp_path: Path,
) -> None:
    # Given the seeded topics and evidence, audited on local[2]: a finding of every kind
    local = seeded_audit.result
    local_rows = {name: frame.collect() for name, frame in local.findings.items()}
    kinds = {name for name, rows in local_rows.items() if rows}
    assert kinds == {n for n, ids in seeded_audit.seeded.expected.items() if ids}
    assert len(kinds) >= 10

    # When the same audit, at the same clock, is submitted to the cluster
    settings = seeded_audit.settings
    argv = [
        *("--bootstrap-servers", settings.bootstrap_servers),
        *("--topic-prefix", settings.topic_prefix),
        *("--as-of", str(local.summary["parameters"]["as_of_ms"])),
        *("--jdbc-url", seeded_audit.seeded.evidence_url),
        *("--conf", "spark.ui.enabled=false"),
    ]
    out = tmp_path / "first"
    done, seconds = submit(
        spark_standalone, harness_settings.spark_jars_dir, [*argv, "--out", str(out)]
    )
    print(f"submit-standalone.sh took {seconds:.0f} s")
    if done.returncode == EXIT_UNAVAILABLE:
        # "Could not run" is a verdict-less exit a scheduler answers by running the audit again;
        # what this test compares is the verdict. One CI run (of c88ef21) met it once, with the
        # reason unseen: printed here (make test-cluster's -rA shows it) and submitted again,
        # into a folder of its own (nothing the first run left is read).
        print(f"the first submission could not run: {outputs(done)}")
        out = tmp_path / "again"
        done, seconds = submit(
            spark_standalone, harness_settings.spark_jars_dir, [*argv, "--out", str(out)]
        )
        print(f"submitted again: submit-standalone.sh took {seconds:.0f} s")

    # Then it exits 1 (violations), having run its executors on both workers ...
    assert done.returncode == EXIT_VIOLATIONS, f"exit {done.returncode}; {outputs(done)}"
    app = application_of(spark_standalone, done)
    ran_on = {p.parent.parent for p in spark_standalone.executor_folders(app)}
    assert ran_on == set(spark_standalone.worker_dirs)
    # ... and finds the same rows of every finding, and counts the same statistics
    summary = json.loads((out / "summary.json").read_text())
    cluster_rows = {
        name: spark.read.parquet(found["parquet"]).collect()
        for name, found in summary["findings"].items()
    }
    assert set(cluster_rows) == set(local_rows) == set(FINDINGS)
    differences = "\n".join(finding_differences(local_rows, cluster_rows))
    assert not differences, f"the cluster's findings differ from local[2]'s:\n{differences}"
    assert summary["statistics"] == local.summary["statistics"]
    assert summary["latency_ms"] == local.summary["latency_ms"]


def test_a_row_that_differs_between_the_runs_is_named_in_the_comparison() -> None:
    from pyspark.sql import Row  # a Row needs no JVM

    local = {"lost": [Row(txn_id="a", missing_indices=[0])], "stuck": [Row(txn_id="b")]}
    cluster = {"lost": [Row(txn_id="a", missing_indices=[1])], "stuck": [Row(txn_id="b")]}
    differences = finding_differences(local, cluster)
    assert len(differences) == 1
    assert differences[0].startswith("lost: only in local[2]: ")
    assert "[0]" not in differences[0] and "(0,)" in differences[0] and "(1,)" in differences[0]
    assert finding_differences(local, {"lost": local["lost"], "stuck": local["stuck"] * 2})
    assert not finding_differences(local, {k: list(reversed(v)) for k, v in local.items()})

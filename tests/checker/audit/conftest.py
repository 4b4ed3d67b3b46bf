"""The seeded-anomaly audit, run once per session for every test that judges its outputs; and
the Spark standalone cluster the ``cluster`` tests submit it to."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from checker.audit.job import AuditResult, run_audit
from checker.audit.settings import AuditSettings
from outbox.testing import HarnessSettings
from outbox.testing.service import ServiceStartError
from tests.checker.audit.seeded import Seeded, seed
from tests.spark_standalone import StandaloneCluster


@dataclass
class SeededAudit:
    seeded: Seeded
    settings: AuditSettings
    result: AuditResult


@pytest.fixture(scope="session")
def seeded_audit(
    spark: Any, kafka_bootstrap: str, postgres_url: str, tmp_path_factory: pytest.TempPathFactory
) -> SeededAudit:
    seeded = seed(kafka_bootstrap, postgres_url)
    out: Path = tmp_path_factory.mktemp("seeded-audit")
    settings = AuditSettings(
        bootstrap_servers=kafka_bootstrap,
        topic_prefix=seeded.prefix,
        as_of="now+10m",  # past the grace period and the check window of every record
        evidence_url=seeded.evidence_url,
        out_dir=str(out),
    )
    return SeededAudit(seeded, settings, run_audit(spark, settings))


@pytest.fixture(scope="session")
def spark_standalone(
    harness_settings: HarnessSettings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StandaloneCluster]:
    """A master and two one-core workers from pyspark's distribution, stopped at session end.
    One that cannot start fails the test under CI=true and skips it elsewhere, as the harness's
    services do."""
    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-standalone"))
    try:
        cluster.start()
    except ServiceStartError as err:
        message = f"could not start a Spark standalone cluster: {err}"
        if harness_settings.ci:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    yield cluster
    cluster.stop()

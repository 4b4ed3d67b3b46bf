"""The seeded-anomaly audit, run once per session for every test that judges its outputs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from checker.audit.job import AuditResult, run_audit
from checker.audit.settings import AuditSettings
from tests.checker.audit.seeded import Seeded, seed


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

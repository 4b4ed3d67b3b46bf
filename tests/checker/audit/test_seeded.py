"""Raw records seeded straight into the topics: the audit reports exactly those anomalies."""

from __future__ import annotations

import json

import pytest

from checker.audit.cli import EXIT_UNAVAILABLE, EXIT_USAGE, main
from checker.audit.findings import FINDINGS
from tests.checker.audit.conftest import SeededAudit

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("finding", list(FINDINGS))
def test_each_finding_reports_exactly_the_seeded_transactions(
    seeded_audit: SeededAudit, finding: str
) -> None:
    expected = seeded_audit.seeded.expected[finding]
    assert seeded_audit.result.txn_ids(finding) == expected


def test_clean_transactions_are_audited_and_never_reported(seeded_audit: SeededAudit) -> None:
    result = seeded_audit.result
    reported = set().union(*(result.txn_ids(name) for name in FINDINGS))
    assert not reported & seeded_audit.seeded.clean
    stats = result.summary["statistics"]
    # 33 clean, 10 seeded one by one, 2 in the same-key pair; the aborted ghost is not seen
    assert stats["transactions"] == 45
    assert stats["put_back_copies"] == 1
    assert stats["by_decider"]["checker"] >= 5
    assert stats["by_state"]["UNDECIDED"] == 1
    assert sorted(result.summary["parameters"]["real_topics"]) == sorted(
        seeded_audit.seeded.real_topics
    )


def test_the_outputs_are_a_json_summary_parquet_per_finding_and_a_report(
    seeded_audit: SeededAudit, spark
) -> None:
    result = seeded_audit.result
    summary = json.loads(result.summary_path.read_text())
    assert summary["verdict"] == "violations"
    assert summary["violations"] == sum(f["count"] for f in summary["findings"].values()) > 0
    for name, finding in summary["findings"].items():
        frame = spark.read.parquet(finding["parquet"])
        assert frame.count() == finding["count"], name
        assert "txn_id" in frame.columns
    lost = summary["findings"]["lost"]
    assert lost["sample_txn_ids"] == sorted(seeded_audit.seeded.expected["lost"])
    row = spark.read.parquet(lost["parquet"]).first()
    assert row.decision_offset is not None and row.half_partition is not None
    assert row.missing_indices == [0] and row.first_half_ms > 0
    assert set(summary["latency_ms"]) == {
        "half_to_decision",
        "decision_to_promotion",
        "half_to_promotion",
    }
    assert result.report_path.stat().st_size > 10_000


def test_the_cli_exits_2_when_the_internal_topics_do_not_exist(
    seeded_audit: SeededAudit, tmp_path, capsys
) -> None:
    argv = [
        "--bootstrap-servers",
        seeded_audit.settings.bootstrap_servers,
        "--topic-prefix",
        "__no-such-prefix",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == EXIT_USAGE
    assert "--topic-prefix" in capsys.readouterr().err


def test_the_cli_exits_3_when_kafka_is_unreachable(
    seeded_audit: SeededAudit, tmp_path, capsys
) -> None:
    argv = [
        "--bootstrap-servers",
        "127.0.0.1:1",
        "--metadata-timeout",
        "3s",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == EXIT_UNAVAILABLE
    assert "did not answer" in capsys.readouterr().err

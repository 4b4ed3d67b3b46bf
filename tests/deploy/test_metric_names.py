"""Every metric the alerting rules and the Grafana dashboard read is one a real relay or checker
exports: `kafka-outbox relay` and `kafka-outbox checker` run as processes against the test
broker with their HTTP ports, and both /metrics are scraped and parsed. A rule or panel on a
misspelt or renamed metric would never fire or show anything, and nothing else would notice.
Names read through rate() or increase() must be counters (or a histogram's series)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from outbox import OutboxSettings
from outbox.testing.ports import free_port
from tests.deploy.monitoring import counted_names, queries, used_metrics
from tests.kafka_helpers import unique
from tests.outbox_cli.test_services import SECRET, get, service

pytestmark = pytest.mark.integration

#: Names that come from elsewhere than the services, and from where.
EXTERNAL = {
    "up": "Prometheus, one per scrape target",
    "kube_job_failed": "kube-state-metrics",
    "kube_job_owner": "kube-state-metrics",
    "kube_deployment_status_replicas_available": "kube-state-metrics",
}


def scrape(port: int) -> dict[str, str]:
    """Each sample name the endpoint serves now (``_total``, ``_bucket``, ... included) and
    the type of its family; nothing when it does not answer yet."""
    status, text = get(f"http://127.0.0.1:{port}/metrics")
    if status != 200:
        return {}
    return {
        sample.name: family.type
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_every_metric_the_rules_and_the_dashboard_read_is_exported_by_the_services(
    kafka_bootstrap: str, outbox_settings: OutboxSettings, tmp_path: Path
) -> None:
    used = used_metrics()
    assert {n for n in used if n in EXTERNAL} == set(EXTERNAL), "EXTERNAL names unused ones"
    wanted = set(used) - set(EXTERNAL)
    relay_port, checker_port = free_port(), free_port()
    relay_env = {
        "OUTBOX_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "OUTBOX_TOPIC_PREFIX": outbox_settings.topic_prefix,
        "OUTBOX_RELAY_GROUP_ID": unique("relay-metrics"),
        "OUTBOX_RELAY_HTTP_PORT": str(relay_port),
    }
    checker_env = {
        "OUTBOX_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "OUTBOX_TOPIC_PREFIX": outbox_settings.topic_prefix,
        "OUTBOX_CHECKER_GROUP_ID": unique("checker-metrics"),
        "OUTBOX_CHECK_SECRET": SECRET,
        "OUTBOX_CHECKER_HTTP_PORT": str(checker_port),
    }
    exported: dict[str, str] = {}
    with (
        service("relay", relay_env, tmp_path / "relay.log"),
        service("checker", checker_env, tmp_path / "checker.log"),
    ):
        # Per-partition series (lag, pending) appear once the relay owns its partitions.
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            exported = scrape(relay_port) | scrape(checker_port)
            if wanted <= set(exported):
                break
            time.sleep(1)
    missing = {name: sorted(used[name]) for name in sorted(wanted - set(exported))}
    assert not missing, f"read by the rules or the dashboard, exported by neither: {missing}"
    counted = {n for expr in queries().values() for n in counted_names(expr)} - set(EXTERNAL)
    not_counters = {n: exported[n] for n in counted if exported[n] not in ("counter", "histogram")}
    assert not not_counters, f"rate() or increase() over gauges: {not_counters}"

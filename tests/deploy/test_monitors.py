"""deploy/k8s/monitoring: the PodMonitors scrape what the relay and checker pods serve. No schema
here knows the Prometheus Operator's resources, so they are held to the Deployments instead:
each selects the pods of one Deployment in its namespace, on a container port that exists and is
the one the service's settings open, at /metrics; and the base stays free of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.deploy.kustomize import Resource, render
from tests.deploy.test_manifests import BASE, OVERLAYS, config_maps, env_of, key

MONITORING = "monitoring.coreos.com/v1"
#: Overlays that include deploy/k8s/monitoring.
MONITORED = [o for o in OVERLAYS if any(r["apiVersion"] == MONITORING for r in render(o))]


def pod_monitors(resources: list[Resource]) -> list[Resource]:
    return [r for r in resources if (r["apiVersion"], r["kind"]) == (MONITORING, "PodMonitor")]


def selected(monitor: Resource, resources: list[Resource]) -> list[Resource]:
    """The Deployments whose pods the monitor selects (matchLabels within the pod labels, same
    namespace: a PodMonitor with no namespaceSelector looks in its own)."""
    assert "namespaceSelector" not in monitor["spec"], "the pods are in the monitor's namespace"
    wanted = monitor["spec"]["selector"]["matchLabels"].items()
    return [
        r
        for r in resources
        if r["kind"] == "Deployment"
        and r["metadata"].get("namespace") == monitor["metadata"].get("namespace")
        and wanted <= r["spec"]["template"]["metadata"]["labels"].items()
    ]


def test_the_base_applies_without_the_prometheus_operator() -> None:
    assert [key(r) for r in render(BASE) if r["apiVersion"] == MONITORING] == []


def test_the_example_overlay_includes_the_monitoring_component() -> None:
    assert [o.name for o in MONITORED] == ["example"]


@pytest.mark.parametrize("overlay", MONITORED, ids=lambda p: p.name)
def test_each_service_is_scraped_by_one_pod_monitor(overlay: Path) -> None:
    resources = render(overlay)
    counts = {key(d): 0 for d in resources if d["kind"] == "Deployment"}
    for monitor in pod_monitors(resources):
        deployments = selected(monitor, resources)
        assert len(deployments) == 1, f"{key(monitor)} selects {[key(d) for d in deployments]}"
        counts[key(deployments[0])] += 1
    assert counts == dict.fromkeys(counts, 1)


@pytest.mark.parametrize("overlay", MONITORED, ids=lambda p: p.name)
def test_pod_monitors_scrape_metrics_on_the_port_the_service_serves_it(overlay: Path) -> None:
    resources = render(overlay)
    maps = config_maps(resources)
    for monitor in pod_monitors(resources):
        [deployment] = selected(monitor, resources)
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        serves = int(env_of(container, maps)[f"OUTBOX_{container['args'][0].upper()}_HTTP_PORT"])
        endpoints: list[dict[str, Any]] = monitor["spec"]["podMetricsEndpoints"]
        assert endpoints
        for endpoint in endpoints:
            assert endpoint["path"] == "/metrics"
            assert endpoint["port"] in ports, f"{key(monitor)}: no container port {endpoint}"
            assert ports[endpoint["port"]] == serves, f"{key(monitor)} scrapes another port"


@pytest.mark.parametrize("overlay", MONITORED, ids=lambda p: p.name)
def test_pod_monitors_take_the_job_label_from_a_label_of_the_pods(overlay: Path) -> None:
    """Without it `job` would be <namespace>/<monitor name>, which the rules do not select."""
    resources = render(overlay)
    for monitor in pod_monitors(resources):
        [deployment] = selected(monitor, resources)
        assert monitor["spec"]["jobLabel"] in deployment["spec"]["template"]["metadata"]["labels"]

"""deploy/monitoring/grafana-dashboard.json imports into any Grafana with a Prometheus data source:
every panel queries the data source chosen in its variable, every query is PromQL that Prometheus
itself accepts (promtool), and the panels do not overlap. That each metric it names is one the
services export is tests/deploy/test_metric_names.py's part."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.deploy.monitoring import dashboard, dashboard_queries, metric_names, panels

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def test_every_panel_queries_the_chosen_prometheus_and_says_what_it_shows() -> None:
    document = dashboard()
    variables = {v["name"]: v for v in document["templating"]["list"]}
    assert (variables["datasource"]["type"], variables["datasource"]["query"]) == (
        "datasource",
        "prometheus",
    )
    assert variables["namespace"]["datasource"] == DATASOURCE
    shown = [p for p in panels(document) if p["type"] != "row"]
    assert shown
    for panel in shown:
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["description"].strip(), panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
            assert 'namespace="$namespace"' in target["expr"], (panel["title"], target["refId"])
        refs = [t["refId"] for t in panel["targets"]]
        assert len(set(refs)) == len(refs), panel["title"]


def test_panels_have_their_own_ids_and_places() -> None:
    document = dashboard()
    every = panels(document)
    ids = [p["id"] for p in every]
    assert len(set(ids)) == len(ids)
    taken: set[tuple[int, int]] = set()
    for panel in every:
        place = panel["gridPos"]
        assert place["x"] >= 0 and place["x"] + place["w"] <= 24, panel["title"]
        cells = {
            (place["x"] + dx, place["y"] + dy)
            for dx in range(place["w"])
            for dy in range(place["h"])
        }
        assert not cells & taken, f"{panel['title']!r} overlaps another panel"
        taken |= cells


def test_every_query_names_its_metrics_and_is_valid_promql_for_prometheus(
    promtool: str, tmp_path: Path
) -> None:
    """promtool checks the queries as recording rules: the same parser Prometheus runs."""
    queries = dashboard_queries()
    assert all(metric_names(expr) for expr in queries.values())
    rules = [
        {"record": f"dashboard:query_{n}", "expr": expr} for n, expr in enumerate(queries.values())
    ]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr

"""What deploy/monitoring holds, read for the tests: the alerting rules, their promtool unit
tests, the Grafana dashboard's queries, and the metric names all of them use.

Names come from a real PromQL parser (promql-parser, the ``deploy-check`` extra), not from
pattern matching: a name inside a label matcher, a function or a ``by (...)`` clause is not a
metric, and a query that does not parse fails here instead of showing an empty panel.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import promql_parser
import yaml

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
RULES = MONITORING / "outbox-rules.yaml"
RULE_TESTS = MONITORING / "outbox-rules.test.yaml"
DASHBOARD = MONITORING / "grafana-dashboard.json"

#: Grafana's variables, as the values a query is parsed (and checked by promtool) with.
GRAFANA_VARIABLES = {
    "$__rate_interval": "5m",
    "$__interval": "1m",
    "$__range": "1h",
    "$namespace": "orders",
}


def alerting_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def rule_tests() -> list[dict[str, Any]]:
    tests: list[dict[str, Any]] = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    return tests


def dashboard() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return document


def panels(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    found = []
    for panel in document["panels"]:
        found.append(panel)
        found += panel.get("panels", [])
    return found


def grafana_expr(expr: str) -> str:
    """A dashboard query with Grafana's variables replaced: plain PromQL."""
    for variable, value in sorted(GRAFANA_VARIABLES.items(), key=lambda v: -len(v[0])):
        expr = expr.replace(variable, value)
    left = re.findall(r"\$\{?\w+", expr)
    if left:
        raise ValueError(f"variables {left} in {expr!r} have no value for the tests")
    return expr


def dashboard_queries() -> dict[str, str]:
    """Every PromQL query of the dashboard (variables replaced), by where it is."""
    document = dashboard()
    queries: dict[str, str] = {}
    for panel in panels(document):
        for target in panel.get("targets", []):
            queries[f"panel {panel['title']!r} {target['refId']}"] = grafana_expr(target["expr"])
    for variable in document["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]["query"]
        found = re.fullmatch(r"label_values\((.+),\s*\w+\)", query)
        if found is None:
            raise ValueError(f"variable {variable['name']}: {query!r} is not label_values()")
        queries[f"variable {variable['name']}"] = grafana_expr(found.group(1))
    return queries


def metric_names(expr: str) -> set[str]:
    """The metric each selector of ``expr`` reads; a selector without one is refused."""
    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            name = node.name or next(
                (m.value for m in node.matchers.matchers if m.name == "__name__"), None
            )
            if name is None:
                raise ValueError(f"a selector in {expr!r} names no metric")
            names.add(name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


#: Functions that only make sense on counters (and a histogram's counters).
COUNTER_FUNCTIONS = {"rate", "irate", "increase", "resets"}


def counted_names(expr: str) -> set[str]:
    """The metrics ``expr`` reads as counters (inside rate(), increase(), ...)."""
    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.Call) and node.func.name in COUNTER_FUNCTIONS:
            for arg in node.args:
                names.update(metric_names(str(arg)))

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def queries() -> dict[str, str]:
    """Every PromQL expression of the rules and the dashboard, by where it is."""
    return {f"alert {r['alert']}": r["expr"] for r in alerting_rules()} | dashboard_queries()


def used_metrics() -> dict[str, set[str]]:
    """Each metric name the rules and the dashboard use, and where."""
    used: dict[str, set[str]] = {}
    for where, expr in queries().items():
        for name in metric_names(expr):
            used.setdefault(name, set()).add(where)
    return used

"""deploy/monitoring/outbox-rules.yaml: valid for Prometheus and unit-tested by promtool (an alert
that fires and one that does not for each), the PrometheusRule carrying the very same groups, and
every alert telling how bad it is, what happened and what to do, with commands that exist for the
names the manifests use."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from outbox_cli.main import build_parser
from tests.deploy import prometheus_rule
from tests.deploy.kustomize import load_all, render
from tests.deploy.monitoring import RULE_TESTS, RULES, alerting_rules, rule_tests

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
BASE = K8S / "base"
COMPONENT = K8S / "monitoring"
SEVERITIES = {"critical", "warning"}


def promtool_run(promtool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *args], capture_output=True, text=True, check=False, timeout=120
    )


def test_promtool_checks_the_rules(promtool: str) -> None:
    done = promtool_run(promtool, "check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_unit_tests_of_the_rules_pass(promtool: str) -> None:
    done = promtool_run(promtool, "test", "rules", str(RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_case_that_fires_and_one_that_does_not() -> None:
    """promtool passes a case that expects no alert from a rule that does not exist, so the
    alert names are held to the rules here, and each alert needs both kinds of case."""
    alerts = {rule["alert"] for rule in alerting_rules()}
    fires: set[str] = set()
    quiet: set[str] = set()
    for test in rule_tests():
        for case in test.get("alert_rule_test", []):
            name = case["alertname"]
            assert name in alerts, f"the unit tests expect {name!r}, which no rule defines"
            (fires if case.get("exp_alerts") else quiet).add(name)
    assert alerts - fires == set(), "alerts no unit test sees firing"
    assert alerts - quiet == set(), "alerts no unit test sees staying quiet"


def test_the_prometheus_rule_is_the_rules_file() -> None:
    """promtool checks the plain file; the Operator must load the very same groups."""
    expected = prometheus_rule.render(RULES.read_text())
    assert prometheus_rule.PROMETHEUS_RULE.read_text() == expected, (
        "deploy/k8s/monitoring/prometheusrule.yaml differs from deploy/monitoring/"
        "outbox-rules.yaml: run `python -m tests.deploy.prometheus_rule`"
    )
    [resource] = load_all(prometheus_rule.PROMETHEUS_RULE)
    assert (resource["apiVersion"], resource["kind"]) == (
        "monitoring.coreos.com/v1",
        "PrometheusRule",
    )
    assert resource["spec"] == yaml.safe_load(RULES.read_text())
    component = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    assert prometheus_rule.PROMETHEUS_RULE.name in component["resources"]


@pytest.mark.parametrize("rule", alerting_rules(), ids=lambda r: r["alert"])
def test_every_alert_has_a_severity_a_summary_a_description_and_a_runbook(
    rule: dict[str, Any],
) -> None:
    assert rule["labels"]["severity"] in SEVERITIES
    annotations = rule["annotations"]
    assert set(annotations) == {"summary", "description", "runbook"}
    assert all(text.strip() for text in annotations.values())
    steps = re.findall(r"^(\d+)\. ", annotations["runbook"], flags=re.MULTILINE)
    assert steps == [str(n) for n in range(1, len(steps) + 1)] and len(steps) >= 2, (
        "a runbook is numbered steps"
    )


def commands(runbook: str, program: str) -> list[list[str]]:
    """Each command line of ``program`` in a runbook: the words after it up to a pipe, a
    parenthesis or the end of the line (explanations follow on the lines after)."""
    found = []
    for match in re.finditer(rf"\b{program} ([^|()\n]+)", runbook):
        found.append(match.group(1).split())
    return found


def parses(words: list[str]) -> bool:
    """Some first words of ``words`` are a command line (``status``, ``inspect TXN_ID``,
    ``topics ensure``: the rest of the line may be prose)."""
    parser = build_parser()
    for end in range(1, len(words) + 1):
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                parser.parse_args(words[:end])
        except SystemExit:
            continue
        return True
    return False


@pytest.mark.parametrize("rule", alerting_rules(), ids=lambda r: r["alert"])
def test_runbook_commands_exist_and_name_what_the_manifests_deploy(rule: dict[str, Any]) -> None:
    """Every `kafka-outbox ...` in a runbook is a command of the CLI, and every Deployment,
    CronJob and pod label a `kubectl` step names is one the base creates."""
    runbook = rule["annotations"]["runbook"]
    named = commands(runbook, "kafka-outbox")
    assert named, "a runbook says which kafka-outbox command to run"
    for words in named:
        assert parses(words), f"`kafka-outbox {' '.join(words)}` is not a command"
    resources = render(BASE)
    kinds = {
        "deploy": {r["metadata"]["name"] for r in resources if r["kind"] == "Deployment"},
        "cronjob": {r["metadata"]["name"] for r in resources if r["kind"] == "CronJob"},
    }
    pods = {
        r["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]
        for r in resources
        if r["kind"] == "Deployment"
    }
    for kind, name in re.findall(r"\b(deploy|cronjob)/([\w-]+)", runbook):
        assert name in kinds[kind], f"{kind}/{name}: the manifests have no such {kind}"
    for name in re.findall(r"app\.kubernetes\.io/name=([\w-]+)", runbook):
        assert name in pods, f"no pods are labelled app.kubernetes.io/name={name}"


def selectors(expr: str) -> list[Any]:
    found: list[Any] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def rule(name: str) -> dict[str, Any]:
    [found] = [r for r in alerting_rules() if r["alert"] == name]
    return found


def test_the_oldest_pending_threshold_lies_past_the_checker_s_whole_check_window() -> None:
    """Below the window the alert would fire on transactions still being checked."""
    settings = next(r for r in render(BASE) if r["kind"] == "ConfigMap")["data"]
    window = float(settings["OUTBOX_CHECKER_TRANSACTION_TIMEOUT_S"]) + float(
        settings["OUTBOX_CHECKER_CHECK_INTERVAL_S"]
    ) * int(settings["OUTBOX_CHECKER_CHECK_MAX"])
    thresholds = {float(t) for t in re.findall(r"> (\d+)", rule("OutboxDecisionsStalled")["expr"])}
    [threshold] = thresholds
    assert threshold > window


def test_the_audit_alert_watches_the_jobs_of_the_audit_cronjob() -> None:
    [cronjob] = [r for r in render(BASE) if r["kind"] == "CronJob"]
    owners = {
        (m.name, m.value)
        for s in selectors(rule("OutboxAuditFailed")["expr"])
        for m in s.matchers.matchers
        if m.name.startswith("owner_")
    }
    assert owners == {("owner_kind", "CronJob"), ("owner_name", cronjob["metadata"]["name"])}


def test_the_target_down_alert_watches_the_jobs_the_pod_monitors_set() -> None:
    """The PodMonitors make `job` the pods' jobLabel value; the alert must name those jobs."""
    monitors = [r for r in load_all(COMPONENT / "podmonitors.yaml") if r["kind"] == "PodMonitor"]
    deployments = {
        r["metadata"]["name"]: r["spec"]["template"]["metadata"]["labels"]
        for r in render(BASE)
        if r["kind"] == "Deployment"
    }
    jobs = set()
    for monitor in monitors:
        selected = monitor["spec"]["selector"]["matchLabels"]
        [labels] = [v for v in deployments.values() if selected.items() <= v.items()]
        jobs.add(labels[monitor["spec"]["jobLabel"]])
    [up] = selectors(rule("OutboxTargetDown")["expr"])
    [job] = [m for m in up.matchers.matchers if m.name == "job"]
    assert set(job.value.split("|")) == jobs


def test_the_no_pod_alert_watches_the_deployments_the_base_creates() -> None:
    """The Deployments it names are the relay's and the checker's, so neither can have no pod
    and no alert (OutboxTargetDown sees only pods that exist)."""
    deployments = {r["metadata"]["name"] for r in render(BASE) if r["kind"] == "Deployment"}
    [available] = selectors(rule("OutboxNoPodAvailable")["expr"])
    [deployment] = [m for m in available.matchers.matchers if m.name == "deployment"]
    assert set(deployment.value.split("|")) == deployments


def test_the_readme_lists_every_alert_with_its_severity() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = readme.index("\n### Metrics and alerts\n")
    section = readme[start : readme.index("\n### ", start + 1)]
    listed = dict(re.findall(r"^\| `(\w+)` \| (\w+) \|", section, flags=re.MULTILINE))
    assert listed == {r["alert"]: r["labels"]["severity"] for r in alerting_rules()}

"""The PrometheusRule of deploy/k8s/monitoring is deploy/monitoring/outbox-rules.yaml wrapped for
the Prometheus Operator, text for text: promtool checks and unit-tests the plain file, which
only holds if the Operator loads the very same groups.

``python -m tests.deploy.prometheus_rule`` writes it; tests/deploy/test_rules.py fails while
the file in the repository differs from what :func:`render` makes.
"""

from __future__ import annotations

from pathlib import Path

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "monitoring" / "outbox-rules.yaml"
PROMETHEUS_RULE = DEPLOY / "k8s" / "monitoring" / "prometheusrule.yaml"

HEADER = """\
# GENERATED from deploy/monitoring/outbox-rules.yaml (its comments say what each alert is for):
# edit that file, then run `python -m tests.deploy.prometheus_rule` to write this one again.
# Your Prometheus loads it when its ruleSelector (often a `release` label: add it with your
# overlay's `labels`) and ruleNamespaceSelector select it.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: kafka-outbox
  labels:
    app.kubernetes.io/name: kafka-outbox
    app.kubernetes.io/part-of: kafka-outbox
spec:
"""


def render(rules_text: str) -> str:
    """The PrometheusRule whose ``spec`` is the rules file from its ``groups:`` line on."""
    lines = rules_text.splitlines()
    start = lines.index("groups:")
    body = [f"  {line}" if line else "" for line in lines[start:]]
    return HEADER + "\n".join(body) + "\n"


def main() -> None:
    PROMETHEUS_RULE.write_text(render(RULES.read_text()))
    print(f"wrote {PROMETHEUS_RULE}")


if __name__ == "__main__":
    main()

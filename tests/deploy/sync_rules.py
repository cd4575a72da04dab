#!/usr/bin/env python3
"""Keeps deploy/base/prometheusrule.yaml equal to deploy/prometheus/rules.yml.

rules.yml is the source (plain Prometheus `rule_files:` form, checked and unit-tested with
promtool); the PrometheusRule carries the same `groups:` under `spec:` for the Prometheus
Operator. The copy is textual, comments included, so the two read the same.

    python3 tests/deploy/sync_rules.py          # exit 1 if the PrometheusRule is stale
    python3 tests/deploy/sync_rules.py --write  # rewrite it
"""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "deploy" / "prometheus" / "rules.yml"
TARGET = REPO / "deploy" / "base" / "prometheusrule.yaml"

HEADER = """\
# GENERATED from deploy/prometheus/rules.yml by tests/deploy/sync_rules.py --write: edit that file.
# tokenmeter's recording rules and alerts for the Prometheus Operator. Your Prometheus picks this
# up only if the object matches its ruleSelector (kube-prometheus-stack: the `release` label of
# its Helm release); add that label in your overlay (see docs/deploy.md).
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: tokenmeter
  labels:
    app.kubernetes.io/name: tokenmeter
    app.kubernetes.io/component: monitoring
spec:
"""


def render():
    lines = SOURCE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("groups:"))
    body = ["  " + line if line.strip() else "" for line in lines[start:]]
    return HEADER + "\n".join(body) + "\n"


def main():
    text = render()
    if "--write" in sys.argv[1:]:
        TARGET.write_text(text)
        print(f"wrote {TARGET.relative_to(REPO)}")
        return 0
    if not TARGET.exists() or TARGET.read_text() != text:
        print(f"{TARGET.relative_to(REPO)} differs from {SOURCE.relative_to(REPO)}: "
              "run python3 tests/deploy/sync_rules.py --write", file=sys.stderr)
        return 1
    print("sync_rules: PrometheusRule matches rules.yml")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Holds rules_test.yml's group_eval_order to deploy/prometheus/rules.yml.

promtool evaluates rule groups at each step in the order `group_eval_order` gives; groups it
does not list sort as equals and keep Go's map order, which changes from run to run. An alert
that reads a recording made in another group then sees either this step's value or the step
before's, and a test that prints the value in an annotation passes or fails by chance. So:

  - group_eval_order lists every group of rules.yml, once, in the file's order;
  - in that order every rule reads only recordings made before it (an earlier group, or earlier
    in its own group), in its expression and in its labels' and annotations' templates.

    python3 tests/deploy/rule_order.py   # exit 1 with one line per problem
"""

import re
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "rules.yml"
TEST = REPO / "tests" / "deploy" / "rules_test.yml"


def reads(text, names):
    """The recorded series among `names` that `text` names as a whole metric name."""
    return {n for n in names if re.search(r"(?<![\w:])" + re.escape(n) + r"(?![\w:])", text)}


def main():
    groups = yaml.safe_load(RULES.read_text())["groups"]
    order = yaml.safe_load(TEST.read_text()).get("group_eval_order") or []
    names = [g["name"] for g in groups]
    problems = []
    if order != names:
        problems.append(
            f"{TEST.relative_to(REPO)}: group_eval_order is {order}; "
            f"it must list every group of {RULES.relative_to(REPO)} in its order: {names}")

    recorded = {r["record"] for g in groups for r in g["rules"] if "record" in r}
    made = set()
    for g in groups:
        for r in g["rules"]:
            text = " ".join([r["expr"]] + [str(v) for k in ("labels", "annotations")
                                           for v in (r.get(k) or {}).values()])
            name = r.get("record") or r.get("alert")
            for later in sorted(reads(text, recorded) - made):
                problems.append(f"{RULES.relative_to(REPO)}: {g['name']}: {name} reads {later}, "
                                "recorded later in the evaluation order")
            if "record" in r:
                made.add(r["record"])

    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        return 1
    print(f"rule_order: group_eval_order lists the {len(names)} groups; each rule reads only "
          "recordings made before it")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Reading the Grafana dashboard the way Grafana does: panels, targets and template variables.

Shared by check_dashboard.py (static structure) and live_test.py (every query against a real
Prometheus). Standard library only.
"""

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "grafana" / "dashboards" / "tokenmeter.json"

# What Grafana puts in place of its built-in variables, for the live test: a one-minute range
# drawn at 5 s per point, and $__rate_interval as Grafana computes it for a data source whose
# scrape interval is set to 5 s: max(4 x 5 s, $__interval + 5 s) = 20 s. (The test scrapes every
# second, so each 20 s window holds about 20 samples: enough that a quantile over a quiet model
# is not NaN by chance.)
BUILTINS = {
    "__rate_interval": "20s",
    "__interval": "5s",
    "__range_s": "60",
    "__range": "60s",
}


def load(path=DASHBOARD):
    with open(path) as f:
        return json.load(f)


def panels(dashboard):
    """Every panel, rows' nested panels included, in order."""
    for p in dashboard.get("panels", []):
        yield p
        for q in p.get("panels", []) or []:
            yield q


def variables(dashboard):
    return {v["name"]: v for v in dashboard.get("templating", {}).get("list", [])}


def variable_query(var):
    q = var.get("query")
    if isinstance(q, dict):
        return q.get("query", "")
    return q or ""


LABEL_VALUES = re.compile(r"^label_values\(\s*(?:(?P<selector>.+?)\s*,\s*)?(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)\s*\)$")


def parse_label_values(query):
    """label_values(selector, label) -> (selector or None, label)."""
    m = LABEL_VALUES.match(query.strip())
    if not m:
        raise ValueError(f"not a label_values() query: {query!r}")
    return m.group("selector"), m.group("label")


def regex_escape(value):
    """How Grafana formats a single value for a Prometheus regex matcher (=~"$var")."""
    return re.sub(r"([\\^$*+?.()|{}\[\]])", r"\\\\\1", value)


VAR_REF = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")


def substitute(expr, values):
    """Replaces $var, ${var} and [[var]]; raises KeyError naming a variable with no value."""

    def repl(m):
        name = m.group(1) or m.group(2) or m.group(3)
        if name not in values:
            raise KeyError(name)
        return values[name]

    return VAR_REF.sub(repl, expr)

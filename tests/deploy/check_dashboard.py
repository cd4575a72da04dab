#!/usr/bin/env python3
"""Static checks of the Grafana dashboard and the Prometheus rules (no server needed).

- the committed JSON is what grafana/build_dashboard.py writes;
- the JSON has the structure Grafana needs: a uid, a schemaVersion, the template variables
  (datasource, namespace, pod, model, gpu_hour_price), every panel with a datasource (rows, which
  hold no query, excepted), unique panel ids, every query target with a unique refId, a datasource
  and an expression, panels inside the 24-column grid and not overlapping;
- every metric name used in a panel, a variable or a rule is one that crates/tokenmeter/src/metrics/mod.rs registers
  (the metric contract), so a renamed metric cannot leave a panel silently empty; every recorded
  series a panel reads (level:metric:operations) is one deploy/prometheus/rules.yml records, so a
  renamed rule cannot either (live_test.py then runs that panel's query against Prometheus with the
  rules loaded, as every other);
- grafana/provisioning points at the folder the dashboard is in.

Standard library only. Exits 1 listing every problem found.
"""

import re
import subprocess
import sys

import dashboard as dash

REPO = dash.REPO
problems = []


def problem(msg):
    problems.append(msg)


def contract_metrics():
    """Metric family names registered in crates/tokenmeter/src/metrics/ (mod.rs and the files beside it, such as
    capacity.rs), with histogram series suffixes."""
    src = "\n".join(f.read_text() for f in sorted((REPO / "crates" / "tokenmeter" / "src" / "metrics").glob("*.rs")))
    names = set(re.findall(r'"(tokenmeter_[a-z0-9_]+)"', src))
    if not names:
        problem("found no metric names in crates/tokenmeter/src/metrics/")
    series = set(names)
    for n in names:
        series |= {n + "_bucket", n + "_sum", n + "_count"}
    return series


def names_in(expr):
    # A name between colons is part of a recorded series (level:metric:operation), not a metric.
    return set(re.findall(r"(?<![:\w])(tokenmeter_[a-z0-9_]+)(?![:\w])", expr))


def recorded_in(expr):
    """Recorded series named in an expression: level:metric:operations (the level may be empty)."""
    return set(re.findall(r"(?<![:\w])([a-z_]*:tokenmeter_[a-z0-9_]+:[a-z0-9_]+)(?![:\w])", expr))


def recorded_series():
    """The series deploy/prometheus/rules.yml records (read as text: standard library only)."""
    text = (REPO / "deploy" / "prometheus" / "rules.yml").read_text()
    return set(re.findall(r"^\s*-?\s*record:\s*(\S+)\s*$", text, re.M))


def check_generated():
    r = subprocess.run([sys.executable, str(REPO / "grafana" / "build_dashboard.py"), "--check"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        problem("dashboard JSON is stale: " + r.stderr.strip())


def check_structure(d, known, records):
    for key in ("uid", "title", "schemaVersion", "panels", "templating", "time", "refresh"):
        if key not in d:
            problem(f"dashboard has no {key!r}")
    if d.get("schemaVersion", 0) < 39:
        problem(f"schemaVersion {d.get('schemaVersion')} is older than Grafana 11's 39")
    vs = dash.variables(d)
    for name in ("datasource", "namespace", "pod", "model", "gpu_hour_price"):
        if name not in vs:
            problem(f"template variable ${name} is missing")
    if vs.get("datasource", {}).get("type") != "datasource" or vs.get("datasource", {}).get("query") != "prometheus":
        problem("$datasource must be a datasource variable of type prometheus")
    for name in ("namespace", "pod", "model"):
        v = vs.get(name, {})
        try:
            sel, label = dash.parse_label_values(dash.variable_query(v))
        except ValueError as e:
            problem(f"${name}: {e}")
            continue
        if label != name:
            problem(f"${name} lists values of label {label!r}")
        for n in names_in(sel or ""):
            if n not in known:
                problem(f"${name} queries {n}, which crates/tokenmeter/src/metrics/mod.rs does not register")
        if v.get("datasource", {}).get("uid") != "${datasource}":
            problem(f"${name} does not use the $datasource variable")
    price = vs.get("gpu_hour_price", {})
    try:
        float(price.get("current", {}).get("value", price.get("query")))
    except (TypeError, ValueError):
        problem("$gpu_hour_price has no numeric default")

    ids = set()
    grid = {}
    for p in dash.panels(d):
        title = p.get("title", "?")
        pid = p.get("id")
        if pid is None or pid in ids:
            problem(f"panel {title!r}: id {pid} missing or not unique")
        ids.add(pid)
        gp = p.get("gridPos", {})
        if not all(k in gp for k in "hwxy") or gp["x"] + gp["w"] > 24:
            problem(f"panel {title!r}: gridPos {gp} is not inside the 24-column grid")
        else:
            for yy in range(gp["y"], gp["y"] + gp["h"]):
                for xx in range(gp["x"], gp["x"] + gp["w"]):
                    if (xx, yy) in grid:
                        problem(f"panel {title!r} overlaps {grid[(xx, yy)]!r}")
                        break
                    grid[(xx, yy)] = title
                else:
                    continue
                break
        if p.get("type") == "row":
            if p.get("targets"):
                problem(f"row {title!r} has targets")
            continue
        if p.get("datasource", {}).get("uid") != "${datasource}":
            problem(f"panel {title!r} has no datasource (or not $datasource)")
        targets = p.get("targets") or []
        if not targets:
            problem(f"panel {title!r} has no targets")
        refs = [t.get("refId") for t in targets]
        if None in refs or "" in refs or len(set(refs)) != len(refs):
            problem(f"panel {title!r}: refIds {refs} missing or not unique")
        for t in targets:
            if t.get("datasource", {}).get("uid") != "${datasource}":
                problem(f"panel {title!r} target {t.get('refId')}: no $datasource")
            expr = t.get("expr", "")
            if not expr.strip():
                problem(f"panel {title!r} target {t.get('refId')}: empty expr")
            # Range windows: $__rate_interval or $__range. $__interval can be as short as one
            # scrape, and a one-sample window gives rate()/increase() nothing to work with.
            for window in re.findall(r"\[([^\]]*)\]", expr):
                if window not in ("$__rate_interval", "$__range"):
                    problem(f"panel {title!r} target {t.get('refId')}: range window [{window}] "
                            "(use $__rate_interval or $__range)")
            used = names_in(expr)
            recorded = recorded_in(expr)
            if not used and not recorded:
                problem(f"panel {title!r} target {t.get('refId')}: uses no tokenmeter metric or recorded series")
            for n in used - known:
                problem(f"panel {title!r} uses {n}, which crates/tokenmeter/src/metrics/mod.rs does not register")
            for n in recorded - records:
                problem(f"panel {title!r} reads {n}, which deploy/prometheus/rules.yml does not record")
        if not p.get("description"):
            problem(f"panel {title!r} has no description")


def check_rules(known):
    text = (REPO / "deploy" / "prometheus" / "rules.yml").read_text()
    for n in names_in(text):
        # Recorded series are named level:metric:operation; only raw names must be in the contract.
        if n not in known:
            problem(f"deploy/prometheus/rules.yml uses {n}, which crates/tokenmeter/src/metrics/mod.rs does not register")


def check_provisioning():
    prov = (REPO / "grafana" / "provisioning" / "dashboards" / "tokenmeter.yaml").read_text()
    if "path:" not in prov or "apiVersion: 1" not in prov:
        problem("grafana/provisioning/dashboards/tokenmeter.yaml is not a dashboard provider file")


def main():
    known = contract_metrics()
    check_generated()
    d = dash.load()
    records = recorded_series()
    if not records:
        problem("found no recording rule in deploy/prometheus/rules.yml")
    check_structure(d, known, records)
    check_rules(known)
    check_provisioning()
    n_panels = sum(1 for p in dash.panels(d) if p.get("type") != "row")
    n_targets = sum(len(p.get("targets", [])) for p in dash.panels(d))
    if problems:
        for p in problems:
            print(f"FAIL: {p}")
        print(f"check_dashboard: {len(problems)} problem(s)")
        return 1
    print(f"check_dashboard: ok ({n_panels} panels, {n_targets} queries, {len(dash.variables(d))} variables)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

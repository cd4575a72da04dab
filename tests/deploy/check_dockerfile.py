#!/usr/bin/env python3
"""Checks the Dockerfile and .dockerignore without Docker (it cannot run on this machine).

- the Dockerfile parses with BuildKit's own parser (the `dockerfile` package wraps it);
- it is multi-stage: a Rust build stage running `cargo build --release --locked`, and a runtime
  stage that is not the build image, whose USER is a numeric non-root id, and whose ENTRYPOINT
  is the binary a `COPY --from=<build stage>` puts there;
- the builder's Debian release is the runtime's (a binary linked against a newer glibc does not
  start on an older one);
- the builder's Rust is at least Cargo.toml's rust-version;
- .dockerignore (evaluated as Docker does: later patterns win, a pattern matching a directory
  covers what is under it) lets in Cargo.toml, Cargo.lock and every file under src/ and crates/, and keeps
  out target/ and .git/.

Needs the `dockerfile` package (tests/deploy/run.sh installs it in its virtualenv).
"""

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import dockerfile

REPO = Path(__file__).resolve().parents[2]
problems = []


def problem(msg):
    problems.append(msg)
    print(f"FAIL: {msg}", flush=True)


def glob_regex(pattern):
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + "$")


def ignore_rules(text):
    rules = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pat = line[1:] if negate else line
        pat = pat.strip("/") or "."
        rules.append((negate, glob_regex(pat)))
    return rules


def excluded(path, rules):
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    out = False
    for negate, rx in rules:
        if any(rx.match(p) for p in prefixes):
            out = not negate
    return out


def tracked_files():
    """The repository's files: git's list, or a walk of the tree outside a git checkout."""
    try:
        r = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
        return r.stdout.split()
    except (OSError, subprocess.CalledProcessError):
        out = []
        for root, dirs, names in os.walk(REPO):
            dirs[:] = [d for d in dirs if d not in (".git", "target")]
            out += [os.path.relpath(os.path.join(root, n), REPO) for n in names]
        return out


def main():
    text = (REPO / "Dockerfile").read_text()
    try:
        cmds = dockerfile.parse_string(text)
    except dockerfile.GoParseError as e:
        problem(f"Dockerfile does not parse: {e}")
        return 1
    args = {c.value[0].split("=", 1)[0]: c.value[0].split("=", 1)[1] for c in cmds
            if c.cmd == "ARG" and "=" in c.value[0]}
    stages = []  # [image, name, [commands]]
    for c in cmds:
        if c.cmd == "FROM":
            image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), c.value[0])
            name = c.value[2] if len(c.value) >= 3 and c.value[1].upper() == "AS" else None
            stages.append([image, name, []])
        elif stages:
            stages[-1][2].append(c)
    if len(stages) < 2:
        problem(f"expected a multi-stage build, found {len(stages)} stage(s)")
        return 1
    build_image, build_name, build_cmds = stages[0]
    run_image, _, run_cmds = stages[-1]
    print(f"  stages: {build_image} AS {build_name} -> {run_image}")
    if not build_image.startswith("rust:"):
        problem(f"build stage {build_image} is not the Rust image")
    if not any("cargo build --release --locked" in " ".join(c.value) for c in build_cmds if c.cmd == "RUN"):
        problem("build stage does not run `cargo build --release --locked`")
    if run_image.startswith("rust:") or run_image == build_image:
        problem("runtime stage is the build image: the image would carry the toolchain")
    if ("bookworm" in build_image) != ("debian12" in run_image or "bookworm" in run_image):
        problem(f"builder {build_image} and runtime {run_image} are not the same Debian release")
    manifest = tomllib.loads((REPO / "Cargo.toml").read_text())
    want = manifest["package"].get("rust-version", "0")
    if isinstance(want, dict):  # `rust-version.workspace = true`: the workspace states it
        want = manifest.get("workspace", {}).get("package", {}).get("rust-version", "0")
    have = re.match(r"rust:(\d+\.\d+)", build_image)
    if not have or tuple(map(int, have.group(1).split("."))) < tuple(map(int, want.split(".")[:2])):
        problem(f"builder {build_image} is older than rust-version {want}")
    users = [c.value[0] for c in run_cmds if c.cmd == "USER"]
    if not users or not re.fullmatch(r"[1-9]\d*(:\d+)?", users[-1]):
        problem(f"runtime USER {users} is not a numeric non-root id (Kubernetes runAsNonRoot needs a number)")
    entry = [c for c in run_cmds if c.cmd == "ENTRYPOINT"]
    if not entry or not entry[-1].json:
        problem("runtime needs an exec-form ENTRYPOINT")
    else:
        binary = entry[-1].value[0]
        copied = [c for c in run_cmds if c.cmd == "COPY" and f"--from={build_name}" in c.flags and c.value[-1] == binary]
        if not copied:
            problem(f"ENTRYPOINT {binary} is not copied from the {build_name} stage")
    exposed = {p for c in run_cmds if c.cmd == "EXPOSE" for p in c.value}
    if not {"8080", "9090"} <= exposed:
        problem(f"runtime EXPOSEs {sorted(exposed)}, expected 8080 and 9090")

    rules = ignore_rules((REPO / ".dockerignore").read_text())
    files = tracked_files()
    needed = ["Cargo.toml", "Cargo.lock"] + [f for f in files if f.startswith(("src/", "crates/"))]
    for f in needed:
        if excluded(f, rules):
            problem(f".dockerignore keeps out {f}, which the build needs")
    for f in ("target/release/tokenmeter", ".git/HEAD", "grafana/dashboards/tokenmeter.json"):
        if not excluded(f, rules):
            problem(f".dockerignore lets in {f}")
    sent = [f for f in files if not excluded(f, rules)]
    print(f"  build context: {len(sent)} of {len(files)} tracked files")
    if problems:
        print(f"check_dockerfile: {len(problems)} problem(s)")
        return 1
    print("check_dockerfile: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

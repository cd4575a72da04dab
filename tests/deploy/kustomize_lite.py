#!/usr/bin/env python3
"""A minimal kustomize for our own overlays, used only where no real kustomize can be installed.

Debian has no kustomize package and PyPI/npm carry no usable build of it, so on a fresh machine
without `kubectl` the manifest checks fall back to this. It implements exactly the features
deploy/ uses, and refuses anything else rather than guess:
  - `resources`: files, and directories holding a kustomization.yaml (recursively);
  - `labels` with `pairs` (metadata.labels only: includeSelectors/includeTemplates false);
  - `images` with `name`, `newName`, `newTag` (containers and initContainers of pod templates);
  - `replacements` with `source` {kind, name, fieldPath} and `targets` {select {kind, name},
    fieldPaths}; field paths as kustomize writes them: `a.b`, `[name=x]` list items,
    `[key.with.dots/and-slashes]` map keys.
When kubectl is there too, check_manifests.py builds each overlay with both and fails if they
differ, so this stays faithful to the real thing.

    kustomize_lite.py DIR    # prints the built resources as a YAML stream
"""

import copy
import sys
from pathlib import Path

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "labels", "images", "replacements"}


class Error(Exception):
    pass


def build(directory):
    directory = Path(directory)
    kfile = directory / "kustomization.yaml"
    if not kfile.exists():
        raise Error(f"{directory}: no kustomization.yaml")
    k = yaml.safe_load(kfile.read_text()) or {}
    unknown = set(k) - SUPPORTED
    if unknown:
        raise Error(f"{kfile}: kustomize_lite does not implement {sorted(unknown)}")
    resources = []
    for entry in k.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            resources.extend(build(path))
        else:
            resources.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    for spec in k.get("labels", []):
        if spec.get("includeSelectors") or spec.get("includeTemplates"):
            raise Error(f"{kfile}: labels with includeSelectors/includeTemplates are not implemented")
        for r in resources:
            r.setdefault("metadata", {}).setdefault("labels", {}).update(spec["pairs"])
    for image in k.get("images", []):
        for r in resources:
            for c in containers(r):
                set_image(c, image)
    for rep in k.get("replacements", []):
        replace(resources, rep, kfile)
    return resources


def containers(resource):
    spec = resource.get("spec", {}).get("template", {}).get("spec", {})
    return (spec.get("containers") or []) + (spec.get("initContainers") or [])


def set_image(container, image):
    ref = container.get("image", "")
    name, tag, digest = ref, None, None
    if "@" in name:
        name, digest = name.split("@", 1)
    if ":" in name.rsplit("/", 1)[-1]:
        name, tag = name.rsplit(":", 1)
    if name != image["name"]:
        return
    name = image.get("newName", name)
    tag = image.get("newTag", tag)
    container["image"] = name + (f":{tag}" if tag else "") + (f"@{digest}" if digest and "newTag" not in image else "")


def split_path(path):
    """kustomize field path -> segments; dots inside [...] or escaped with a backslash stay."""
    segs, cur, depth, i = [], "", 0, 0
    while i < len(path):
        ch = path[i]
        if ch == "\\" and i + 1 < len(path):
            cur += path[i + 1]
            i += 2
            continue
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "." and depth == 0:
            segs.append(cur)
            cur = ""
        else:
            cur += ch
        i += 1
    segs.append(cur)
    return segs


def step(node, seg, where):
    if seg.startswith("[") and seg.endswith("]"):
        inner = seg[1:-1]
        if "=" in inner and isinstance(node, list):
            k, v = inner.split("=", 1)
            for item in node:
                if isinstance(item, dict) and str(item.get(k)) == v:
                    return item
            raise Error(f"{where}: no list item with {k}={v}")
        seg = inner
    if isinstance(node, dict) and seg in node:
        return node[seg]
    if isinstance(node, list) and seg.isdigit() and int(seg) < len(node):
        return node[int(seg)]
    raise Error(f"{where}: no field {seg!r}")


def walk(obj, segs, where):
    node = obj
    for seg in segs:
        node = step(node, seg, where)
    return node


def get(obj, path, where):
    return walk(obj, split_path(path), where)


def put(obj, path, value, where):
    segs = split_path(path)
    parent = walk(obj, segs[:-1], where)
    last = segs[-1]
    key = last[1:-1] if last.startswith("[") and "=" not in last else last
    if not (isinstance(parent, dict) and key in parent):
        raise Error(f"{where}: no field {last!r} to replace")
    parent[key] = copy.deepcopy(value)


def select(resources, sel):
    return [r for r in resources
            if r.get("kind") == sel.get("kind", r.get("kind"))
            and r.get("metadata", {}).get("name") == sel.get("name", r.get("metadata", {}).get("name"))]


def replace(resources, rep, kfile):
    unknown = set(rep) - {"source", "targets"}
    if unknown:
        raise Error(f"{kfile}: replacement fields {sorted(unknown)} are not implemented")
    src = rep["source"]
    matches = select(resources, src)
    if len(matches) != 1:
        raise Error(f"{kfile}: replacement source {src} matches {len(matches)} resources")
    value = get(matches[0], src.get("fieldPath", "metadata.name"), f"{kfile} source")
    for t in rep["targets"]:
        if set(t) - {"select", "fieldPaths"}:
            raise Error(f"{kfile}: replacement target options {sorted(set(t) - {'select', 'fieldPaths'})} are not implemented")
        for r in select(resources, t["select"]):
            for fp in t["fieldPaths"]:
                put(r, fp, value, f"{kfile} target {fp}")


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        docs = build(sys.argv[1])
    except Error as e:
        print(f"kustomize_lite: {e}", file=sys.stderr)
        return 1
    sys.stdout.write(yaml.safe_dump_all(docs, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())

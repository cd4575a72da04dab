//! The code's layering, held to the map in ARCHITECTURE.md ("Who may import whom").
//!
//! It reads every module of `src/` as text (not its unit tests: a file named `tests.rs`, and
//! whatever follows a file's first `#[cfg(test)]`, which the house style puts last), takes the
//! `crate::<module>` and `super::<module>` paths its code names (comments left out), and fails
//! on four things:
//!
//! - an arrow between two top-level modules that [`ALLOWED`] does not list: the product never
//!   reaches the tools, a leaf imports nothing of the crate, and so on;
//! - an arrow [`ALLOWED`] lists that no code takes any more, so the map stays true;
//! - a cycle between top-level modules;
//! - a cycle between two modules that share a parent (`proxy::admission` and
//!   `proxy::metering`, say), other than those [`KNOWN_CYCLES`] names with the reason they stay
//!   (none today). A known cycle that is gone fails too, so the list stays true.
//!
//! It reads text, so it can be fooled by a path built in a macro; the crate has none that
//! names another module.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module of `src/` and the modules its code may name. A module missing here
/// fails the test, so a new one is placed on the map when it is added.
const ALLOWED: &[(&str, &[&str])] = &[
    // Leaves: they import nothing of the crate.
    ("units", &[]),
    ("quantile", &[]),
    ("host", &[]),
    ("signal", &[]),
    ("ratelog", &[]),
    ("drain", &[]),
    ("overload", &[]),
    ("replicas", &[]),
    ("protocol", &[]),
    ("context", &[]),
    ("error", &[]),
    // What the request path is made of, bottom up.
    ("read", &["protocol"]),
    // The usage filter cuts the stream by the SSE framer the meter's decoder reads by.
    ("inject", &["protocol", "read"]),
    ("tls", &["error"]),
    ("upgrade", &[]),
    ("gpus", &["host"]),
    // The class table reads `--slo-file` through `host`.
    ("slo", &["host", "units"]),
    // The capacity model takes each class's targets from the SLO class table.
    ("capacity", &["slo"]),
    // What one finished request was: written by the meter, read by every sink.
    ("record", &["context", "protocol", "slo"]),
    (
        "metrics",
        &["capacity", "gpus", "protocol", "record", "slo"],
    ),
    ("reqlog", &["context", "protocol", "ratelog", "record"]),
    ("otlp", &["context", "protocol", "ratelog", "record"]),
    ("tenant", &["host", "metrics"]),
    (
        "meter",
        &[
            "capacity", "context", "metrics", "protocol", "read", "record", "slo", "tenant",
        ],
    ),
    ("tap", &["error", "meter", "record"]),
    // The layers take their own settings (`proxy::Settings`): nothing of the request path
    // reaches up to `config`.
    (
        "proxy",
        &[
            "drain", "error", "inject", "meter", "metrics", "overload", "protocol", "ratelog",
            "read", "record", "tap", "tls", "upgrade",
        ],
    ),
    ("ui", &["metrics", "quantile", "record"]),
    ("admin", &["drain", "metrics", "overload", "ui"]),
    // Settings: flags and variables mapped onto each subsystem's types.
    (
        "config",
        &[
            "capacity", "context", "gpus", "host", "metrics", "otlp", "protocol", "proxy",
            "replicas", "slo", "tenant", "tls", "units",
        ],
    ),
    (
        "server",
        &[
            "admin", "capacity", "config", "context", "drain", "meter", "metrics", "overload",
            "proxy", "otlp", "ratelog", "record", "replicas", "reqlog", "tenant", "tls", "ui",
        ],
    ),
    // Beside the product: the tools may use any of it; nothing above names them.
    (
        "tools",
        &[
            "capacity", "config", "metrics", "protocol", "quantile", "read", "record", "server",
            "signal", "units",
        ],
    ),
];

/// Cycles between sibling modules that remain, each with why. The test fails when one of
/// these is gone (delete it here) or a new one appears.
const KNOWN_CYCLES: &[(&str, &str, &str)] = &[];

/// One module's code (not its unit tests) and its path in the crate.
struct Module {
    /// `["proxy", "inspect"]` for `src/proxy/inspect.rs`; `["tools"]` for `src/tools/mod.rs`.
    path: Vec<String>,
    code: String,
}

fn modules(src: &Path) -> Vec<Module> {
    let mut files = Vec::new();
    walk(src, &mut files);
    files
        .into_iter()
        .filter_map(|file| {
            let rel = file.strip_prefix(src).ok()?.with_extension("");
            let mut path: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if path.last().is_some_and(|p| p == "mod") {
                path.pop();
            }
            let unit_tests = path.iter().any(|p| p == "tests");
            let root = path.len() == 1 && (path[0] == "lib" || path[0] == "main");
            if unit_tests || root {
                return None;
            }
            let text = std::fs::read_to_string(&file).ok()?;
            let code = match text.find("#[cfg(test)]") {
                Some(i) => &text[..i],
                None => &text[..],
            };
            Some(Module {
                path,
                code: strip_comments(code),
            })
        })
        .collect()
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            walk(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The text without `//` comments (doc comments name modules in links; that is no import).
/// A `//` inside a string literal cuts the rest of its line, which can only hide a path.
fn strip_comments(code: &str) -> String {
    code.lines()
        .map(|line| match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The identifiers that follow `prefix` in `code` (`crate::` gives `metrics`, `proxy`, ...).
fn names_after<'a>(code: &'a str, prefix: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().next_back();
        let after = &rest[i + prefix.len()..];
        let end = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') && end > 0 {
            out.push(&after[..end]);
        }
        rest = &after[end..];
    }
    out
}

/// Top-level arrows: module -> the other top-level modules its files name, with one file each.
fn top_level(mods: &[Module]) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut g: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for m in mods {
        let from = &m.path[0];
        let entry = g.entry(from.clone()).or_default();
        for to in names_after(&m.code, "crate::") {
            if to != from {
                entry
                    .entry(to.to_string())
                    .or_insert_with(|| m.path.join("::"));
            }
        }
    }
    g
}

/// Arrows between siblings: `a::b -> a::c` when `a::b` names `super::c` or `crate::a::c`.
fn siblings(mods: &[Module]) -> BTreeSet<(String, String)> {
    let known: BTreeSet<String> = mods.iter().map(|m| m.path.join("::")).collect();
    let mut arrows = BTreeSet::new();
    for m in mods.iter().filter(|m| m.path.len() >= 2) {
        let parent = m.path[..m.path.len() - 1].join("::");
        let me = m.path.join("::");
        let mut named = names_after(&m.code, "super::");
        let prefix = format!("crate::{parent}::");
        named.extend(names_after(&m.code, &prefix));
        for n in named {
            let sib = format!("{parent}::{n}");
            if sib != me && known.contains(&sib) {
                arrows.insert((me.clone(), sib));
            }
        }
    }
    arrows
}

/// A cycle in the top-level graph, as the path around it.
fn find_cycle(g: &BTreeMap<String, BTreeMap<String, String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeMap<String, String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = stack.iter().position(|s| s == n) {
            let mut cycle = stack[i..].to_vec();
            cycle.push(n.to_string());
            return Some(cycle);
        }
        if done.contains(n) {
            return None;
        }
        stack.push(n.to_string());
        for next in g.get(n).into_iter().flat_map(|m| m.keys()) {
            if let Some(c) = visit(next, g, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    g.keys()
        .find_map(|n| visit(n, g, &mut Vec::new(), &mut done))
}

fn crate_modules() -> Vec<Module> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mods = modules(&src);
    assert!(
        mods.len() > 50,
        "read only {} modules of {}",
        mods.len(),
        src.display()
    );
    mods
}

#[test]
fn every_arrow_between_top_level_modules_is_on_the_map() {
    let allowed: BTreeMap<&str, BTreeSet<&str>> = ALLOWED
        .iter()
        .map(|(m, to)| (*m, to.iter().copied().collect()))
        .collect();
    let mut wrong = Vec::new();
    for (from, tos) in top_level(&crate_modules()) {
        let Some(ok) = allowed.get(from.as_str()) else {
            wrong.push(format!(
                "{from}: not on the map (add it to ALLOWED and ARCHITECTURE.md)"
            ));
            continue;
        };
        for (to, file) in tos {
            if !ok.contains(to.as_str()) {
                wrong.push(format!("{from} -> {to} (in {file}) is not on the map"));
            }
        }
    }
    assert!(wrong.is_empty(), "layering:\n  {}", wrong.join("\n  "));
}

// The map is what ARCHITECTURE.md draws: an arrow it allows that the code no longer takes is a
// claim that is no longer true.
#[test]
fn every_arrow_on_the_map_is_taken() {
    let taken = top_level(&crate_modules());
    let mut stale = Vec::new();
    for (from, tos) in ALLOWED {
        for to in *tos {
            if !taken.get(*from).is_some_and(|t| t.contains_key(*to)) {
                stale.push(format!("{from} -> {to}"));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "arrows on the map that no code takes (remove them from ALLOWED and ARCHITECTURE.md):\n  {}",
        stale.join("\n  ")
    );
}

#[test]
fn the_top_level_modules_form_no_cycle() {
    let g = top_level(&crate_modules());
    if let Some(cycle) = find_cycle(&g) {
        panic!("module cycle: {}", cycle.join(" -> "));
    }
}

#[test]
fn siblings_form_no_cycle_but_the_known_ones() {
    let arrows = siblings(&crate_modules());
    let mut cycles = BTreeSet::new();
    for (a, b) in &arrows {
        if a < b && arrows.contains(&(b.clone(), a.clone())) {
            cycles.insert((a.clone(), b.clone()));
        }
    }
    let known: BTreeSet<(String, String)> = KNOWN_CYCLES
        .iter()
        .map(|(a, b, _)| (a.to_string(), b.to_string()))
        .collect();
    let new: Vec<_> = cycles.difference(&known).collect();
    let gone: Vec<_> = known.difference(&cycles).collect();
    assert!(
        new.is_empty(),
        "new cycles between sibling modules: {new:?}"
    );
    assert!(
        gone.is_empty(),
        "known cycles that are gone (remove them from KNOWN_CYCLES): {gone:?}"
    );
}

#[test]
fn the_reader_sees_arrows_and_not_comments() {
    let code = strip_comments("use crate::metrics::X; // crate::tools\nlet y = crate::units::f();");
    assert_eq!(names_after(&code, "crate::"), ["metrics", "units"]);
    assert_eq!(
        names_after("foocrate::x super::y", "crate::"),
        Vec::<&str>::new()
    );
    assert_eq!(names_after("foocrate::x super::y", "super::"), ["y"]);
}

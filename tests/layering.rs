//! The code's layering, held to the map in ARCHITECTURE.md ("Who may import whom").
//!
//! It reads two crates, each against its own tables: the library (`crates/tokenmeter/src/`;
//! [`ALLOWED`], [`KNOWN_CYCLES`]) and the tools (`crates/tools/src/`; [`TOOLS_ALLOWED`],
//! [`TOOLS_KNOWN_CYCLES`]); arrows between crates are Cargo's to hold. Each module is read as
//! text, without its comments and without what is compiled for tests only: each item under
//! `#[cfg(test)]` (a unit-test module, a test-only function or constant), and each module
//! declared under it (`#[cfg(test)] mod testing;`), whose file is not read at all. It takes the
//! `crate::<module>`, `super::<module>` and child paths that code names, and fails on five things:
//!
//! - an arrow between two top-level modules that the map does not list: the product never names
//!   the composition root, a leaf imports nothing of the crate, and so on;
//! - an arrow the map lists that no code takes any more, so the map stays true;
//! - a cycle of any length between top-level modules;
//! - a cycle of any length within a folder: between the modules that share a parent
//!   (`proxy::admission -> proxy::metering -> proxy::inspect -> proxy::admission`, say), and
//!   between a folder's `mod.rs` and its children (the parent uses a child, which reaches back
//!   for an item of the parent's), other than the known ones, each listed with the reason it
//!   stays. A known cycle that is gone fails too, so the list stays true;
//! - a test-only module that product code names.
//!
//! It reads text, so it can be fooled by a path built in a macro; neither crate has one that
//! names another module.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module of the library and the modules its code may name. A module missing here
/// fails the test, so a new one is placed on the map when it is added.
const ALLOWED: &[(&str, &[&str])] = &[
    // Leaves: they import nothing of the crate.
    ("units", &[]),
    ("quantile", &[]),
    ("rng", &[]),
    ("host", &[]),
    ("signal", &[]),
    ("ratelog", &[]),
    ("drain", &[]),
    ("overload", &[]),
    ("replicas", &[]),
    ("protocol", &[]),
    ("context", &[]),
    ("error", &[]),
    // The model's tokenizer and chat template: text in, counts out.
    ("tokenize", &["units"]),
    // The Prometheus text reader: the engine's page, and the tools' scrapes of our own.
    ("exposition", &[]),
    // What the request path is made of, bottom up.
    ("read", &["protocol"]),
    // The usage filter cuts the stream by the SSE framer the meter's decoder reads by.
    ("inject", &["protocol", "read"]),
    ("tls", &["error"]),
    ("upgrade", &[]),
    // The silence limit between body frames: a body wrapper beneath the tap.
    ("idle", &["error"]),
    ("gpus", &["host"]),
    // The class table reads `--slo-file` through `host`.
    ("slo", &["host", "units"]),
    // Who pays for the GPU: the books and the prices, knowing nothing of the request path.
    ("cost", &[]),
    // What one finished request was: written by the meter, read by every sink.
    ("record", &["context", "cost", "protocol", "slo"]),
    // The capacity model takes each class's targets from the SLO class table, and is one of the
    // record's sinks: a finished request joins its mix.
    (
        "capacity",
        &[
            "cost", "protocol", "quantile", "record", "rng", "slo", "units",
        ],
    ),
    // The engine's own view: read over the upstream's TLS settings, parsed with `exposition`,
    // its cache size handed to the capacity model.
    (
        "engine",
        &["capacity", "exposition", "ratelog", "tls", "units"],
    ),
    (
        "metrics",
        &[
            "capacity", "cost", "engine", "gpus", "protocol", "record", "slo", "units", "workload",
        ],
    ),
    // Where the logs write: a file of lines, reopened on SIGHUP.
    ("logfile", &["ratelog"]),
    (
        "reqlog",
        &["context", "logfile", "protocol", "record", "units"],
    ),
    // The workload trace: a record's lengths and prefix blocks, as Mooncake lines.
    ("workload", &["logfile", "protocol", "record"]),
    // Span export, with the OTEL_* variables' rules, read through `host`.
    (
        "otlp",
        &["context", "host", "protocol", "ratelog", "record"],
    ),
    ("tenant", &["host", "metrics"]),
    (
        "meter",
        &[
            "capacity", "context", "cost", "metrics", "protocol", "ratelog", "read", "record",
            "slo", "tenant", "tokenize",
        ],
    ),
    // The tap observes; it names the idle wrapper's error `timeout`.
    ("tap", &["error", "idle", "meter", "record"]),
    // The layers take their own settings (`proxy::Settings`): nothing of the request path
    // reaches up to `config`.
    (
        "proxy",
        &[
            "drain", "error", "idle", "inject", "meter", "overload", "protocol", "ratelog", "read",
            "record", "tap", "tls", "tokenize", "units", "upgrade",
        ],
    ),
    ("ui", &["metrics", "quantile", "record", "units"]),
    ("admin", &["drain", "metrics", "overload", "ui"]),
    // Where a connection is accepted, served and drained: knows the stack it serves, not how
    // it was built.
    (
        "server",
        &[
            "admin", "drain", "error", "metrics", "proxy", "ratelog", "tls", "ui", "units",
        ],
    ),
    // The validated configuration: each subsystem's settings (tokenmeter-flags fills it).
    (
        "config",
        &[
            "capacity", "engine", "gpus", "meter", "metrics", "otlp", "proxy", "replicas",
            "server", "slo", "tenant", "tls", "ui", "workload",
        ],
    ),
    // The composition root: builds every part from the settings and hands them to the server.
    (
        "app",
        &[
            "admin", "capacity", "config", "context", "drain", "engine", "inject", "logfile",
            "meter", "metrics", "otlp", "overload", "proxy", "record", "replicas", "reqlog",
            "server", "tenant", "tls", "tokenize", "ui", "workload",
        ],
    ),
];

/// Cycles within a folder that remain, each as its modules (in the order `cycles` prints them:
/// sorted) and why. The test fails when one of these is gone (delete it here) or a new one
/// appears.
const KNOWN_CYCLES: &[(&[&str], &str)] = &[
    (
        &[
            "metrics",
            "metrics::engine",
            "metrics::families",
            "metrics::live",
            "metrics::recording",
            "metrics::vllm",
        ],
        "`impl Metrics` split by concern (the per-event handles, a finished record's \
         observations, the request path's family groups, vLLM's names) over the struct's private \
         fields and the config types mod.rs holds; the registry and its constructors are \
         `registrar.rs`, which reaches back for nothing",
    ),
    (
        &["meter", "meter::recorder"],
        "the recorder builds mod.rs's private request state when it puts a request in flight, \
         and that state holds the recorder; undone by moving the state to a file of its own",
    ),
    (
        &[
            "protocol",
            "protocol::anthropic",
            "protocol::cohere",
            "protocol::gemini",
            "protocol::json",
            "protocol::llamacpp",
            "protocol::ollama",
            "protocol::openai",
            "protocol::replicate",
            "protocol::responses",
            "protocol::sglang",
            "protocol::tgi",
            "protocol::timings",
            "protocol::triton",
            "protocol::watsonx",
        ],
        "mod.rs holds the event types every extractor returns (`Stop`, `Api`, the summary) \
         beside the dispatch to each format's extractor; undone by moving the types to a file \
         of their own",
    ),
    (
        &[
            "proxy",
            "proxy::admission",
            "proxy::inspect",
            "proxy::metering",
            "proxy::pool",
            "proxy::resend",
            "proxy::timeout",
            "proxy::upgrades",
            "proxy::upstream",
        ],
        "mod.rs composes the stack from the layers and holds what they share (`ProxyBody`, \
         `ProxyError`, `full`); undone by moving those to files of their own",
    ),
    (
        &["read", "read::ndjson", "read::sse"],
        "mod.rs holds the `Message` both framers hand out and dispatches to them",
    ),
    (
        &["slo", "slo::judge", "slo::spec"],
        "`Targets` and `Class` live in mod.rs, which re-exports the judge and the spec parser \
         that build and read them",
    ),
];

/// The tools' crate's map, as [`ALLOWED`] is the library's: each top-level module of
/// `crates/tools/src/` and the tools' modules it may name. What they use of the library
/// (`tokenmeter::...`) is Cargo's to hold, not this map's.
const TOOLS_ALLOWED: &[(&str, &[&str])] = &[
    // The simulator stands alone: the instrument the rest is measured against.
    ("sim", &[]),
    // One GET of a `/metrics` page, parsed with the library's `exposition`.
    ("scrape", &[]),
    // A workload trace read back: the Mooncake lines `--workload-log` writes.
    ("trace", &[]),
    // The load generator; its view of the proxy is a scrape; it replays a trace.
    ("bench", &["scrape", "trace"]),
    // The live capacity model read back from `/metrics`, drawn with the bench's charts; and a
    // trace replayed on the engine it fitted (`--trace`).
    ("capacity_command", &["bench", "scrape", "trace"]),
    ("cost_command", &["scrape"]),
    // The simulator, the proxy and the bench's load in one process.
    ("demo", &["bench", "sim"]),
];

/// The tools' crate's folder cycles that remain, as [`KNOWN_CYCLES`] are the library's.
const TOOLS_KNOWN_CYCLES: &[(&[&str], &str)] = &[(
    &[
        "sim::wire",
        "sim::wire::anthropic",
        "sim::wire::ollama",
        "sim::wire::openai",
        "sim::wire::tgi",
    ],
    "mod.rs holds what every format shares (`Reply`, `Options`, `BodyError`, `flag`, ...) and \
         dispatches to each format's reader and writers; undone by moving the shared types and \
         helpers to a file of their own, the dispatch staying in mod.rs",
)];

/// A crate the test reads: where its sources are, its map, its known folder cycles.
struct Crate {
    /// From the workspace root.
    src: &'static str,
    allowed: &'static [(&'static str, &'static [&'static str])],
    known_cycles: &'static [(&'static [&'static str], &'static str)],
    /// The names of the two tables, for the messages.
    tables: [&'static str; 2],
    /// A test-only module it declares, and how many modules it has at least: a reader that
    /// finds fewer reads nothing.
    test_only: &'static str,
    at_least: usize,
}

const CRATES: &[Crate] = &[
    Crate {
        src: "crates/tokenmeter/src",
        allowed: ALLOWED,
        known_cycles: KNOWN_CYCLES,
        tables: ["ALLOWED", "KNOWN_CYCLES"],
        test_only: "proxy::testing",
        at_least: 50,
    },
    Crate {
        src: "crates/tools/src",
        allowed: TOOLS_ALLOWED,
        known_cycles: TOOLS_KNOWN_CYCLES,
        tables: ["TOOLS_ALLOWED", "TOOLS_KNOWN_CYCLES"],
        test_only: "sim::wire::tests",
        at_least: 20,
    },
];

/// One module's code (not what is compiled for tests only) and its path in the crate.
struct Module {
    /// `["proxy", "inspect"]` for `src/proxy/inspect.rs`; `["engine"]` for `src/engine/mod.rs`.
    path: Vec<String>,
    code: String,
    /// The children this module declares under `#[cfg(test)]`: test-only modules.
    test_only: Vec<String>,
}

/// Every module of a crate's `src/` but the crate root and the test-only ones; and the
/// test-only ones' paths, joined with `::`.
fn modules(src: &Path) -> (Vec<Module>, BTreeSet<String>) {
    let mut files = Vec::new();
    walk(src, &mut files);
    let all: Vec<Module> = files
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
            let root = path.len() == 1 && (path[0] == "lib" || path[0] == "main");
            if root {
                return None;
            }
            let text = std::fs::read_to_string(&file).ok()?;
            let (code, test_only) = product_code(&text);
            Some(Module {
                path,
                code,
                test_only,
            })
        })
        .collect();
    let test_only: BTreeSet<String> = all
        .iter()
        .flat_map(|m| {
            m.test_only
                .iter()
                .map(|c| [m.path.join("::"), c.clone()].join("::"))
        })
        .collect();
    let under_test =
        |m: &Module| (1..=m.path.len()).any(|n| test_only.contains(&m.path[..n].join("::")));
    let product = all.into_iter().filter(|m| !under_test(m)).collect();
    (product, test_only)
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

/// `text` as the checks read it: without its comments, and without what is compiled for tests
/// only ([`without_tests`]); and the test-only modules it declares.
fn product_code(text: &str) -> (String, Vec<String>) {
    without_tests(&strip_comments(text))
}

/// The text without its comments: `//` to the end of the line and `/* */` (nested), each left as
/// one space (doc comments name modules in links; that is no import). Literals are kept whole:
/// a `//` in `"http://..."` is text, and a path in a string (`deserialize_with = "..."`) counts.
fn strip_comments(code: &str) -> String {
    let b = code.as_bytes();
    let mut out = String::with_capacity(code.len());
    let (mut i, mut kept) = (0, 0);
    while i < b.len() {
        if let Some(end) = literal_end(b, i) {
            i = end;
            continue;
        }
        let end = match (b[i], b.get(i + 1)) {
            (b'/', Some(b'/')) => b[i..]
                .iter()
                .position(|c| *c == b'\n')
                .map_or(b.len(), |n| i + n),
            (b'/', Some(b'*')) => block_comment_end(b, i + 2),
            _ => {
                i += 1;
                continue;
            }
        };
        out.push_str(&code[kept..i]);
        out.push(' ');
        (i, kept) = (end, end);
    }
    out.push_str(&code[kept..]);
    out
}

/// Past the `*/` that closes a block comment whose text starts at `i`, inner ones counted.
fn block_comment_end(b: &[u8], mut i: usize) -> usize {
    let mut depth = 1;
    while i < b.len() {
        match (b[i], b.get(i + 1)) {
            (b'/', Some(b'*')) => (depth, i) = (depth + 1, i + 2),
            (b'*', Some(b'/')) if depth == 1 => return i + 2,
            (b'*', Some(b'/')) => (depth, i) = (depth - 1, i + 2),
            _ => i += 1,
        }
    }
    b.len()
}

const CFG_TEST: &str = "#[cfg(test)]";

/// `code` (without comments) without each item under `#[cfg(test)]`, and the names of the modules
/// declared there (`mod testing;`), whose files are test-only.
fn without_tests(code: &str) -> (String, Vec<String>) {
    let mut out = String::new();
    let mut test_only = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(CFG_TEST) {
        out.push_str(&rest[..i]);
        let item = &rest[i + CFG_TEST.len()..];
        let len = item_len(item);
        let words: Vec<&str> = item[..len]
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty())
            .collect();
        // `mod name;` (possibly `pub(crate) mod name;`): a file of its own.
        if item[..len].trim_end().ends_with(';') {
            if let Some(at) = words.iter().position(|w| *w == "mod") {
                if let Some(name) = words.get(at + 1) {
                    test_only.push(name.to_string());
                }
            }
        }
        rest = &item[len..];
    }
    out.push_str(rest);
    (out, test_only)
}

/// The length of the item at the start of `s` (without comments): its attributes, then up to a
/// `;` outside any brackets or through the `}` that closes its body. Literals are skipped, so a
/// brace inside one does not count; a bracket that closes what encloses the item ends it too.
fn item_len(s: &str) -> usize {
    let b = s.as_bytes();
    let mut depth = 0i32;
    let mut i = 0;
    while i < b.len() {
        if let Some(end) = literal_end(b, i) {
            i = end;
            continue;
        }
        match b[i] {
            b'{' | b'(' | b'[' => depth += 1,
            b'}' | b')' | b']' if depth == 0 => return i,
            b'}' | b')' | b']' => {
                depth -= 1;
                if depth == 0 && b[i] == b'}' {
                    return i + 1;
                }
            }
            b';' if depth == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    b.len()
}

/// Past the end of the literal that starts at `i`, if one does: a string (`"..."`, `b"..."`,
/// `c"..."`), a raw one with any number of `#` (`r#"..."#`, `br"..."`), or a character
/// (`'{'`, `'\''`, `b'"'`, `'é'`); not a lifetime or a label (`'a`, `'outer:`), not a raw
/// identifier (`r#type`).
fn literal_end(b: &[u8], i: usize) -> Option<usize> {
    let ident =
        |at: Option<usize>| at.is_some_and(|j| b[j].is_ascii_alphanumeric() || b[j] == b'_');
    match b[i] {
        b'"' => Some(string_end(b, i + 1)),
        b'r' => {
            // `r`, `br` or `cr`, not the end of an identifier (`for`, `bar`).
            let prefix = i.checked_sub(1).filter(|j| matches!(b[*j], b'b' | b'c'));
            let start = prefix.unwrap_or(i);
            if ident(start.checked_sub(1)) {
                return None;
            }
            let hashes = b[i + 1..].iter().take_while(|c| **c == b'#').count();
            (b.get(i + 1 + hashes) == Some(&b'"'))
                .then(|| raw_string_end(b, i + 2 + hashes, hashes))
        }
        b'\'' if b.get(i + 1) == Some(&b'\\') => {
            // '\n', '\'', '\u{7f}': the escaped character, then up to the closing quote.
            let close = b.get(i + 3..)?.iter().position(|c| *c == b'\'')?;
            Some(i + 4 + close)
        }
        b'\'' => {
            // One character (of one to four bytes), then the closing quote; else a lifetime.
            let width = match b.get(i + 1)? {
                c if *c < 0x80 => 1,
                c if *c >= 0xf0 => 4,
                c if *c >= 0xe0 => 3,
                _ => 2,
            };
            (b.get(i + 1 + width) == Some(&b'\'')).then_some(i + 2 + width)
        }
        _ => None,
    }
}

/// Past the closing quote of a string whose text starts at `i`.
fn string_end(b: &[u8], mut i: usize) -> usize {
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    b.len()
}

/// Past the end of a raw string whose text starts at `i` and ends at a `"` and `hashes` `#`s.
fn raw_string_end(b: &[u8], mut i: usize, hashes: usize) -> usize {
    while i < b.len() {
        if b[i] == b'"' && b[i + 1..].iter().take_while(|c| **c == b'#').count() >= hashes {
            return i + 1 + hashes;
        }
        i += 1;
    }
    b.len()
}

/// The identifiers that follow `prefix` in `code` (`crate::` gives `metrics`, `proxy`, ...),
/// where `prefix` starts a path (not `foocrate::`, not `a::super::`); a group
/// (`super::{judge::Verdict, Targets}`) gives the first identifier of each of its paths.
fn names_after<'a>(code: &'a str, prefix: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().next_back();
        let after = &rest[i + prefix.len()..];
        let starts = !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
        if starts && after.starts_with('{') {
            let group = &after[1..group_end(after)];
            out.extend(group_heads(group));
            rest = &after[1..];
            continue;
        }
        let end = ident_end(after);
        if starts && end > 0 {
            out.push(&after[..end]);
        }
        rest = &after[end..];
    }
    out
}

fn ident_end(s: &str) -> usize {
    s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len())
}

/// The index of the `}` that closes the group `s` opens with `{` (or the end).
fn group_end(s: &str) -> usize {
    let mut depth = 0;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    s.len()
}

/// The first identifier of each path in a group's text (`a::{b, c}, d as e, self` gives `a`,
/// `d`; `self` names the module itself, no other).
fn group_heads(group: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    let bytes = group.as_bytes();
    for i in 0..=bytes.len() {
        let c = bytes.get(i).copied();
        match c {
            Some(b'{') => depth += 1,
            Some(b'}') => depth -= 1,
            Some(b',') | None if depth == 0 => {
                let item = group[start..i].trim_start();
                let end = ident_end(item);
                if end > 0 && &item[..end] != "self" {
                    out.push(&item[..end]);
                }
                start = i + 1;
            }
            _ => {}
        }
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

/// Arrows within each folder, between modules by their paths: a child to a sibling
/// (`super::c`, `crate::a::c`), a child to its parent (`super::Item` or `crate::a::Item`, an item
/// of the parent's own code, not a module), and a parent to a child (`c::`, `self::c::` or
/// `crate::a::c::` in the parent's code: a use or a re-export; `mod c;` names none).
fn within_folders(mods: &[Module]) -> BTreeMap<String, BTreeSet<String>> {
    let known: BTreeSet<String> = mods.iter().map(|m| m.path.join("::")).collect();
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for m in mods {
        let me = m.path.join("::");
        g.entry(me.clone()).or_default();
        // As a parent: the children its own code names.
        for child in known.iter().filter_map(|k| {
            let rest = k.strip_prefix(&me)?.strip_prefix("::")?;
            (!rest.contains("::")).then_some(rest)
        }) {
            let prefixes = [
                format!("{child}::"),
                format!("self::{child}::"),
                format!("crate::{me}::{child}::"),
            ];
            if prefixes.iter().any(|p| starts_a_path(&m.code, p)) {
                g.entry(me.clone())
                    .or_default()
                    .insert(format!("{me}::{child}"));
            }
        }
        // As a child: its siblings and its parent.
        if m.path.len() < 2 {
            continue;
        }
        let parent = m.path[..m.path.len() - 1].join("::");
        let mut named = names_after(&m.code, "super::");
        let prefix = format!("crate::{parent}::");
        named.extend(names_after(&m.code, &prefix));
        if m.code.contains("super::*") {
            named.push("*");
        }
        for n in named {
            if n == "super" {
                continue;
            }
            let sib = format!("{parent}::{n}");
            let to = if known.contains(&sib) {
                sib
            } else {
                parent.clone()
            };
            if to != me {
                g.entry(me.clone()).or_default().insert(to);
            }
        }
    }
    g
}

/// Whether `code` names `prefix` where a path starts.
fn starts_a_path(code: &str, prefix: &str) -> bool {
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().next_back();
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            return true;
        }
        rest = &rest[i + prefix.len()..];
    }
    false
}

/// The cycles of a graph: each strongly connected component of more than one node (Tarjan's
/// algorithm), its nodes sorted.
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<Vec<String>> {
    struct Tarjan<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: BTreeSet<Vec<String>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.g.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut scc = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    scc.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if scc.len() > 1 {
                    scc.sort();
                    self.out.insert(scc);
                }
            }
        }
    }
    let mut t = Tarjan {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: BTreeSet::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.out
}

/// The top-level arrows as a plain graph.
fn plain(g: &BTreeMap<String, BTreeMap<String, String>>) -> BTreeMap<String, BTreeSet<String>> {
    g.iter()
        .map(|(k, v)| (k.clone(), v.keys().cloned().collect()))
        .collect()
}

/// Each crate's modules and test-only modules, read (see [`modules`]).
fn read(c: &Crate) -> (Vec<Module>, BTreeSet<String>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(c.src);
    let (mods, test_only) = modules(&src);
    assert!(
        mods.len() >= c.at_least && test_only.contains(c.test_only),
        "read {} modules of {} (expected {} at least) and the test-only {test_only:?} \
         (expected {} among them)",
        mods.len(),
        src.display(),
        c.at_least,
        c.test_only
    );
    (mods, test_only)
}

/// What `check` finds wrong in each crate, each line after the crate's `src/`.
fn in_each_crate(check: impl Fn(&Crate, &[Module], &BTreeSet<String>) -> Vec<String>) -> String {
    let mut out = Vec::new();
    for c in CRATES {
        let (mods, test_only) = read(c);
        out.extend(
            check(c, &mods, &test_only)
                .into_iter()
                .map(|f| format!("{}: {f}", c.src)),
        );
    }
    out.join("\n")
}

/// The arrows between a crate's top-level modules that its map does not list.
fn off_the_map(c: &Crate, mods: &[Module]) -> Vec<String> {
    let allowed: BTreeMap<&str, BTreeSet<&str>> = c
        .allowed
        .iter()
        .map(|(m, to)| (*m, to.iter().copied().collect()))
        .collect();
    let mut wrong = Vec::new();
    for (from, tos) in top_level(mods) {
        let Some(ok) = allowed.get(from.as_str()) else {
            wrong.push(format!(
                "{from}: not on the map (add it to {} and ARCHITECTURE.md)",
                c.tables[0]
            ));
            continue;
        };
        for (to, file) in tos {
            if !ok.contains(to.as_str()) {
                wrong.push(format!("{from} -> {to} (in {file}) is not on the map"));
            }
        }
    }
    wrong
}

/// The arrows a crate's map lists that no code takes.
fn stale_arrows(c: &Crate, mods: &[Module]) -> Vec<String> {
    let taken = top_level(mods);
    let mut stale = Vec::new();
    for (from, tos) in c.allowed {
        for to in *tos {
            if !taken.get(*from).is_some_and(|t| t.contains_key(*to)) {
                stale.push(format!(
                    "{from} -> {to} is on the map but no code takes it (remove it from {} and \
                     ARCHITECTURE.md)",
                    c.tables[0]
                ));
            }
        }
    }
    stale
}

/// The failures of the folder check: new cycles, and known ones that are gone.
fn folder_failures(c: &Crate, mods: &[Module]) -> Vec<String> {
    let found = cycles(&within_folders(mods));
    let known: BTreeSet<Vec<String>> = c
        .known_cycles
        .iter()
        .map(|(c, _)| c.iter().map(|s| s.to_string()).collect())
        .collect();
    let mut out: Vec<String> = found
        .difference(&known)
        .map(|c| format!("new cycle: {}", c.join(" <-> ")))
        .collect();
    out.extend(known.difference(&found).map(|gone| {
        format!(
            "known cycle gone (remove it from {}): {gone:?}",
            c.tables[1]
        )
    }));
    out
}

/// What product code names of the test-only modules.
fn test_only_named(mods: &[Module], test_only: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    for m in mods {
        for t in test_only {
            let (parent, name) = t.rsplit_once("::").unwrap_or(("", t));
            let from_parent =
                m.path.join("::") == parent && starts_a_path(&m.code, &format!("{name}::"));
            let from_sibling = m.path.len() >= 2
                && m.path[..m.path.len() - 1].join("::") == parent
                && names_after(&m.code, "super::").contains(&name);
            if from_parent || from_sibling || m.code.contains(&format!("crate::{t}")) {
                out.push(format!("{} names the test-only {t}", m.path.join("::")));
            }
        }
    }
    out
}

#[test]
fn every_arrow_between_top_level_modules_is_on_the_map() {
    let wrong = in_each_crate(|c, mods, _| off_the_map(c, mods));
    assert!(wrong.is_empty(), "layering:\n{wrong}");
}

// The map is what ARCHITECTURE.md draws: an arrow it allows that the code no longer takes is a
// claim that is no longer true.
#[test]
fn every_arrow_on_the_map_is_taken() {
    let stale = in_each_crate(|c, mods, _| stale_arrows(c, mods));
    assert!(stale.is_empty(), "stale arrows:\n{stale}");
}

#[test]
fn the_top_level_modules_form_no_cycle() {
    let found = in_each_crate(|_, mods, _| {
        cycles(&plain(&top_level(mods)))
            .iter()
            .map(|c| format!("module cycle: {}", c.join(" <-> ")))
            .collect()
    });
    assert!(found.is_empty(), "{found}");
}

#[test]
fn no_folder_has_a_cycle_but_the_known_ones() {
    let failures = in_each_crate(|c, mods, _| folder_failures(c, mods));
    assert!(failures.is_empty(), "{failures}");
}

#[test]
fn product_code_names_no_test_only_module() {
    let named = in_each_crate(|_, mods, test_only| test_only_named(mods, test_only));
    assert!(named.is_empty(), "{named}");
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
    assert_eq!(
        names_after(
            "use super::{\n    judge::{End, Verdict},\n    Targets, self,\n};",
            "super::"
        ),
        ["judge", "Targets"]
    );
    assert_eq!(
        names_after("use crate::{metrics::Metrics, units};", "crate::"),
        ["metrics", "units"]
    );
}

#[test]
fn the_reader_skips_what_is_compiled_for_tests_only() {
    let code = r##"use crate::a::X;
#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) const LONG: E = E { s: "}", c: '{', l: &'static str };
fn kept() { crate::b::f() }
#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests { use crate::c::Y; fn t() { let _ = r#"}"#; } }
use crate::d::Z;"##;
    let (kept, test_only) = without_tests(code);
    assert_eq!(names_after(&kept, "crate::"), ["a", "b", "d"]);
    assert_eq!(test_only, ["testing"]);
}

/// Each kind of literal ends where Rust ends it (the reader meets `b"..."` and `b'.'` at their
/// quote, `br"..."` at its `r`); a lifetime, a label and a raw identifier are none.
#[test]
fn the_reader_knows_where_a_literal_ends() {
    let first_literal = |code: &'static str| {
        (0..code.len()).find_map(|i| literal_end(code.as_bytes(), i).map(|end| &code[i..end]))
    };
    let cases = [
        (r#"f("a } \" // b") }"#, Some(r#""a } \" // b""#)),
        (r##"r#"a "} b"# }"##, Some(r##"r#"a "} b"#"##)),
        (r###"r##"a "# } b"## }"###, Some(r###"r##"a "# } b"##"###)),
        (r#"r"a \" }"#, Some(r#"r"a \""#)),
        (r##"br#"}\"# }"##, Some(r##"r#"}\"#"##)),
        (r#"b"}\"{" }"#, Some(r#""}\"{""#)),
        ("'{' }", Some("'{'")),
        ("'\"' }", Some("'\"'")),
        (r"'\'' }", Some(r"'\''")),
        (r"'\u{7d}' }", Some(r"'\u{7d}'")),
        ("'é' }", Some("'é'")),
        ("b'{' }", Some("'{'")),
        ("fn f<'a>(s: &'a str) -> &'static str { s }", None),
        ("'outer: loop { break 'outer; }", None),
        ("let r#type = br;", None),
    ];
    for (code, literal) in cases {
        assert_eq!(first_literal(code), literal, "in {code}");
    }
}

/// What follows a test module is read, however many literals and comments the module holds that
/// a brace counter would stumble on (the `//` in a URL string most of all), and none of the
/// module is: a reader that ends the module early reads a `hidden` path.
#[test]
fn the_reader_reads_on_after_a_test_module() {
    let code = r####"use crate::a::X;
/* a block comment { with /* a nested one } */ and } more */
#[cfg(test)]
mod tests {
    use crate::hidden::Y;
    const URL: &str = "http://10.0.0.7:8000/"; // a `//` in a string, and "one" in a comment
    use crate::hidden::Y;
    const BRACES: &str = "}}{\"}\\";
    use crate::hidden::Y;
    const RAW: &str = r#"a "quoted" } brace"#;
    use crate::hidden::Y;
    const RAWER: &str = r##"a "# } still in"##;
    use crate::hidden::Y;
    const BYTES: &[u8] = b"}\"{";
    use crate::hidden::Y;
    const RAW_BYTES: &[u8] = br#"}\"#;
    use crate::hidden::Y;
    const CHARS: [char; 5] = ['}', '"', '\'', '\u{7d}', 'é'];
    use crate::hidden::Y;
    const BYTE: u8 = b'{';
    use crate::hidden::Y;
    fn f<'a>(s: &'a str) -> &'a str {
        'outer: loop {
            break 'outer s;
        }
    }
    use crate::hidden::Y;
    /* } /* { */ } */
    use crate::hidden::Y;
    /// crate::in_a_doc_comment and `http://x`
    fn g() {}
}
use crate::foo::Bar;
fn h() -> &'static str { "crate::in_a_string" }"####;
    let (kept, _) = product_code(code);
    assert_eq!(
        names_after(&kept, "crate::"),
        ["a", "foo", "in_a_string"],
        "read as product code:\n{kept}"
    );
}

/// A cycle of three siblings, a parent and child that use each other, and a test-only module
/// named by product code are each caught: what the checks above would miss if they did not work.
#[test]
fn each_check_fails_on_a_wrong_import() {
    let m = |path: &str, code: &str| Module {
        path: path.split("::").map(String::from).collect(),
        code: code.to_string(),
        test_only: Vec::new(),
    };
    let three = [
        m("p", "mod a; mod b; mod c;"),
        m("p::a", "use super::b::X;"),
        m("p::b", "use super::c::Y;"),
        m("p::c", "use crate::p::a::Z;"),
    ];
    assert_eq!(
        cycles(&within_folders(&three)),
        BTreeSet::from([vec!["p::a".into(), "p::b".into(), "p::c".into()]])
    );
    let parent = [
        m("p", "mod a; pub use a::Thing; pub struct Settings;"),
        m("p::a", "use super::Settings;"),
    ];
    assert_eq!(
        cycles(&within_folders(&parent)),
        BTreeSet::from([vec!["p".into(), "p::a".into()]])
    );
    // A child that uses its parent's items while the parent only declares it: no cycle.
    let fine = [
        m("p", "mod a; pub struct Settings;"),
        m("p::a", "use super::Settings;"),
    ];
    assert!(cycles(&within_folders(&fine)).is_empty());
    let uses_testing = [m("p", "mod testing; fn f() { testing::stub() }")];
    assert_eq!(
        test_only_named(&uses_testing, &BTreeSet::from(["p::testing".to_string()])),
        ["p names the test-only p::testing"]
    );
}

//! Metric names and flags are a contract: every family the proxy exports is in the metric
//! tables of docs/metrics.md and docs/compat.md, and every name those tables list is one the code
//! can export; every flag `--help` shows reads its `TOKENMETER_*` variable and has a row, naming
//! it, in docs/flags.md's flag table; every request log key has a row in docs/request-log.md.
//!
//! A family added without a row (or a row left behind by a rename) fails here, not in a
//! user's dashboard.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use tokenmeter::metrics::names;

use crate::support::stream_once;
use crate::support::upstream;

const MS: Duration = Duration::from_millis(1);

/// A document of the repository (a path from its root), as the repository holds it.
fn doc(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The metrics reference: tokenmeter's own names (docs/metrics.md), then vLLM's and
/// OpenTelemetry's (docs/compat.md).
fn metric_docs() -> String {
    doc("docs/metrics.md") + &doc("docs/compat.md")
}

/// The family names of an exposition (its `# TYPE` lines).
fn families(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// The metric names a document's tables list: the backticked names in the first cell of a
/// table row that start with one of the exported prefixes (a row may list two names).
fn listed(text: &str) -> BTreeSet<String> {
    let prefixes = ["tokenmeter_", "vllm:", "gen_ai_"];
    text.lines()
        .filter_map(|l| l.strip_prefix("| "))
        .filter_map(|l| l.split(" |").next())
        .flat_map(|cell| cell.split('`').skip(1).step_by(2))
        .filter(|name| prefixes.iter().any(|p| name.starts_with(p)))
        .map(str::to_owned)
        .collect()
}

/// Every source file's text, to find the names the code can export.
fn sources(dir: &Path, out: &mut String) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
        }
    }
}

#[tokio::test]
async fn every_exported_family_has_a_row_in_the_metric_docs() {
    // Every naming scheme and every optional label at once, so every family that one
    // streamed request can make appears in the scrape.
    let flags = [
        "--compat",
        "vllm,otel",
        "--tenant-header",
        "x-tenant",
        "--gpu-hour-cost",
        "2.5",
        "--request-log",
        "/dev/null",
        "--otlp-endpoint",
        "http://127.0.0.1:9",
    ];
    let mut steps = upstream::openai_chat(20 * MS, 8, 2 * MS, true);
    // The engine's own timings too (vLLM's `metrics` object), for the families they make.
    let done = steps.pop();
    steps.push(upstream::Step::Send(bytes::Bytes::from_static(
        b"data: {\"model\":\"test-model\",\"choices\":[],\"metrics\":{\"queue_time_ms\":1.0,\"time_to_first_token_ms\":2.0,\"speculative_decoding\":{\"draft_acceptance_rate\":0.5}}}\n\n",
    )));
    steps.extend(done);
    let streamed = stream_once(steps, &flags).await;
    assert_eq!(streamed.seen.status, 200);
    let exported = families(&streamed.scrape);
    // The scrape is a real one: the families of each scheme are there to be checked.
    for must in [
        "tokenmeter_requests_total",
        "tokenmeter_time_to_first_token_seconds",
        "vllm:time_to_first_token_seconds",
        "gen_ai_server_time_to_first_token_seconds",
        "tokenmeter_time_to_first_token_part_seconds",
    ] {
        assert!(exported.contains(must), "{must} not exported");
    }
    let listed = listed(&metric_docs());
    let missing: Vec<_> = exported.difference(&listed).collect();
    assert!(
        missing.is_empty(),
        "exported but not in the metric tables of docs/metrics.md or docs/compat.md: {missing:?}"
    );
}

/// The families of the golden exposition (crates/tokenmeter/tests/golden/exposition.txt): every
/// family a tokenmeter can export, with every optional part on, each on a line of its own
/// (`name type {labels}`, its help indented below).
fn golden_families() -> BTreeSet<String> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/tokenmeter/tests/golden/exposition.txt");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with(' '))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// The scrape above sees only what one request makes; the golden file has every family
/// registered, with a series or not yet (the capacity model's before its fit, the engine's view
/// before the engine states it, the logs' counters).
#[test]
fn every_family_of_the_golden_exposition_has_a_row_in_the_metric_docs() {
    let golden = golden_families();
    // The file is found and read (a change of its layout must not make this test empty).
    assert!(
        golden.len() > 80,
        "only {} families in the golden file",
        golden.len()
    );
    assert!(golden.contains(names::capacity::MAX_CONCURRENCY));
    let listed = listed(&metric_docs());
    let missing: Vec<_> = golden.difference(&listed).collect();
    assert!(
        missing.is_empty(),
        "in the golden exposition but not in the metric docs' tables: {missing:?}"
    );
}

#[test]
fn every_name_the_metric_docs_list_is_in_the_code() {
    let listed = listed(&metric_docs());
    // The tables are found at all (a change of their layout must not make this test empty).
    assert!(listed.len() > 40, "only {} names found", listed.len());
    // The library names the proxy's series, the tools' crate the simulator's.
    let mut code = String::new();
    for dir in ["crates/tokenmeter/src", "crates/tools/src"] {
        sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join(dir), &mut code);
    }
    let unknown: Vec<_> = listed
        .iter()
        .filter(|name| !code.contains(&format!("\"{name}\"")))
        .collect();
    assert!(
        unknown.is_empty(),
        "listed in docs/metrics.md or docs/compat.md but no source names them: {unknown:?}"
    );
}

/// The proxy's long flags as `--help` prints them (each option line starts with its flags).
fn help_flags(help: &str) -> Vec<String> {
    help.lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with('-'))
        .filter_map(|l| {
            l.split([' ', ','])
                .find(|w| w.starts_with("--"))
                .map(|w| w.split('=').next().unwrap_or(w).to_owned())
        })
        .filter(|f| f != "--help" && f != "--version")
        .collect()
}

#[test]
fn every_proxy_flag_has_its_variable_and_a_row_in_the_flags_doc() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
        .arg("--help")
        .output()
        .expect("run --help");
    let help = String::from_utf8_lossy(&out.stdout);
    let flags = help_flags(&help);
    assert!(
        flags.len() > 40,
        "only {} flags found: {flags:?}",
        flags.len()
    );
    let flags_doc = doc("docs/flags.md");
    let rows: Vec<&str> = flags_doc
        .lines()
        .filter(|l| l.starts_with("| `--"))
        .collect();
    let mut problems = Vec::new();
    for flag in &flags {
        let var = format!(
            "TOKENMETER_{}",
            flag.trim_start_matches("--")
                .replace('-', "_")
                .to_uppercase()
        );
        if !help.contains(&format!("[env: {var}=")) {
            problems.push(format!("{flag}: --help names no {var}"));
        }
        let cell = format!("| `{flag}");
        let row = rows
            .iter()
            .find(|r| r.starts_with(&cell) && r[cell.len()..].starts_with(['`', ' ']));
        match row {
            None => problems.push(format!("{flag}: no row in docs/flags.md's flag table")),
            Some(r) if !r.contains(&format!("`{var}`")) => {
                problems.push(format!("{flag}: its docs/flags.md row does not name {var}"))
            }
            Some(_) => {}
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn every_request_log_key_has_a_row_in_the_request_log_doc_in_order() {
    let section = doc("docs/request-log.md");
    let rows: Vec<&str> = section
        .lines()
        .filter_map(|l| l.strip_prefix("| `")?.split('`').next())
        .collect();
    assert_eq!(
        rows,
        tokenmeter::reqlog::KEYS,
        "docs/request-log.md's keys, in the line's order"
    );
}

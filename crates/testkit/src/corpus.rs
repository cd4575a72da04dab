//! The corpus of real streamed bodies in `../shared/corpus` (third-party data: read, never copied).

use std::path::PathBuf;

/// One row of MANIFEST.tsv.
#[derive(Debug, Clone)]
pub struct Entry {
    pub path: String,
    pub family: String,
    pub endpoint: String,
    pub expected_output_tokens: Option<u64>,
    pub expected_input_tokens: Option<u64>,
    pub content_events: Option<u64>,
    pub body: Vec<u8>,
}

/// The corpus folder: `$TOKENMETER_CORPUS`, else `<repo>/../shared/corpus`.
pub fn dir() -> Option<PathBuf> {
    let p = std::env::var_os("TOKENMETER_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus")
        });
    p.join("MANIFEST.tsv").is_file().then_some(p)
}

/// The streams captured from a real vLLM here: `$TOKENMETER_CAPTURED`, else
/// `<repo>/../shared/captured` (same manifest columns as the corpus).
pub fn captured_dir() -> Option<PathBuf> {
    let p = std::env::var_os("TOKENMETER_CAPTURED")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/captured")
        });
    p.join("MANIFEST.tsv").is_file().then_some(p)
}

/// Every corpus entry with its body. Without the corpus: panics under CI=true, else prints a loud
/// SKIPPED line ([`crate::skip()`]) and returns None.
pub fn load(test: &str) -> Option<Vec<Entry>> {
    let Some(dir) = dir() else {
        assert!(
            !crate::in_ci(),
            "{test}: corpus not found (set TOKENMETER_CORPUS or put it at ../shared/corpus)"
        );
        crate::skip(
            &crate::current_test(),
            "corpus not found (set TOKENMETER_CORPUS or put it at ../shared/corpus to run it)",
        );
        return None;
    };
    let entries = read_manifest(&dir);
    assert!(
        entries.len() >= 100,
        "corpus looks truncated: {} files",
        entries.len()
    );
    Some(entries)
}

/// Every captured stream with its body; without them, as [`load`] does without the corpus.
pub fn load_captured(test: &str) -> Option<Vec<Entry>> {
    let Some(dir) = captured_dir() else {
        assert!(
            !crate::in_ci(),
            "{test}: captured streams not found (set TOKENMETER_CAPTURED or put them at ../shared/captured)"
        );
        crate::skip(
            &crate::current_test(),
            "captured streams not found (set TOKENMETER_CAPTURED or put them at ../shared/captured to run it)",
        );
        return None;
    };
    Some(read_manifest(&dir))
}

/// The rows of `dir/MANIFEST.tsv`, each with its file's bytes.
fn read_manifest(dir: &std::path::Path) -> Vec<Entry> {
    let manifest = std::fs::read_to_string(dir.join("MANIFEST.tsv")).expect("read manifest");
    let mut lines = manifest.lines();
    let header: Vec<&str> = lines.next().expect("header").split('\t').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).expect(name);
    let (path, family, endpoint) = (col("path"), col("family"), col("endpoint"));
    let (out, inp, ev) = (
        col("expected_output_tokens"),
        col("expected_input_tokens"),
        col("content_events"),
    );
    lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            let num = |i: usize| f.get(i).and_then(|s| s.trim().parse().ok());
            Entry {
                path: f[path].to_string(),
                family: f[family].to_string(),
                endpoint: f[endpoint].to_string(),
                expected_output_tokens: num(out),
                expected_input_tokens: num(inp),
                content_events: num(ev),
                body: std::fs::read(dir.join(f[path])).expect("read corpus file"),
            }
        })
        .collect()
}

//! The documentation's links resolve: every relative link `[text](path)` or
//! `[text](path#anchor)` in README.md, ARCHITECTURE.md and docs/*.md names a file that exists
//! (relative to the linking file), and an anchor into a Markdown file names one of its headings,
//! spelt as GitHub spells a heading's anchor. A section moved or renamed without its links fails
//! here, not in a reader's browser.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The repository's root.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The documents whose links are checked.
fn documents() -> Vec<PathBuf> {
    let mut docs = vec![root().join("README.md"), root().join("ARCHITECTURE.md")];
    let dir = root().join("docs");
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut md: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    md.sort();
    docs.extend(md);
    docs
}

/// The lines of a Markdown text outside fenced code blocks.
fn prose(text: &str) -> impl Iterator<Item = &str> {
    let mut fenced = false;
    text.lines().filter(move |l| {
        let fence = l.trim_start().starts_with("```");
        if fence {
            fenced = !fenced;
        }
        !fence && !fenced
    })
}

/// A heading's anchor as GitHub makes it: lower case, every character but letters, digits,
/// spaces, `-` and `_` dropped, spaces turned into `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown text's headings; a repeated heading's are `-1`, `-2`, ... after
/// the first, as on GitHub.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in prose(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes..]);
        let mut anchor = base.clone();
        let mut n = 0;
        while out.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        out.insert(anchor);
    }
    out
}

/// The relative link targets of a Markdown text: what follows `](` up to `)`, outside code
/// blocks and code spans, leaving out URLs with a scheme (`https:`, `mailto:`).
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        let mut from = 0;
        while let Some(at) = line[from..].find("](") {
            let start = from + at + 2;
            from = start;
            // Inside a code span (an odd number of backticks before it): not a link.
            if line[..start].matches('`').count() % 2 == 1 {
                continue;
            }
            let Some(len) = line[start..].find(')') else {
                continue;
            };
            let target = &line[start..start + len];
            let scheme = target
                .split_once(':')
                .is_some_and(|(s, _)| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphabetic()));
            if target.is_empty() || target.contains(' ') || scheme {
                continue;
            }
            out.push(target.to_owned());
        }
    }
    out
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let docs = documents();
    assert!(docs.len() > 10, "only {} documents found", docs.len());
    let mut checked = 0;
    let mut broken = Vec::new();
    for doc in &docs {
        let text =
            std::fs::read_to_string(doc).unwrap_or_else(|e| panic!("{}: {e}", doc.display()));
        let name = doc
            .strip_prefix(root())
            .unwrap_or(doc)
            .display()
            .to_string();
        for target in links(&text) {
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                doc.clone()
            } else {
                doc.parent().unwrap_or(root()).join(path)
            };
            if !file.exists() {
                broken.push(format!("{name}: {target}: no such file"));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if file.extension().is_none_or(|x| x != "md") {
                continue;
            }
            let linked = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            if !anchors(&linked).contains(anchor) {
                broken.push(format!("{name}: {target}: no heading with that anchor"));
            }
        }
    }
    // The links are found at all (a change of the parsing must not make this test empty).
    assert!(checked > 100, "only {checked} links found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn anchors_are_spelt_as_github_spells_them() {
    assert_eq!(
        slug(" The engine's own view: `--engine-metrics`"),
        "the-engines-own-view---engine-metrics"
    );
    assert_eq!(
        slug("Capacity at SLO: how many users per GPU"),
        "capacity-at-slo-how-many-users-per-gpu"
    );
    let text = "# A\n## Flags\n```sh\n# not a heading\n```\n### Flags\n";
    let found: Vec<_> = anchors(text).into_iter().collect();
    assert_eq!(found, ["a", "flags", "flags-1"]);
    let text = "see [x](a.md#b), `[y](not.md)`, [z](https://e.org) and ![i](p.png)\n";
    assert_eq!(links(text), ["a.md#b", "p.png"]);
}

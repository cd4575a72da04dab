//! `promtool check metrics` over an exposition, as CI lints `/metrics` (Debian's `prometheus`
//! package ships it): missing, it fails the test under `CI=true` and skips loudly elsewhere.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// A program on `PATH`.
pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| std::path::Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// promtool's lines about `exposition` (empty: it passed), or `None` when promtool is not
/// installed outside CI (the caller skips).
pub fn lint(exposition: &str) -> Option<Vec<String>> {
    let Some(promtool) = which("promtool") else {
        assert!(
            !crate::support::in_ci(),
            "promtool is required in CI (apt-get install prometheus)"
        );
        crate::support::skip(
            &crate::support::current_test(),
            "promtool not installed, so the exposition is not linted (apt-get install prometheus)",
        );
        return None;
    };
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(exposition.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("promtool");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let lines: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    assert!(
        out.status.success() || !lines.is_empty(),
        "promtool failed without saying why"
    );
    Some(lines)
}

/// The one lint a vLLM name draws (promtool reserves `:` for recording rules; vLLM's own
/// `/metrics` gets the same line), and the only one allowed.
pub fn is_vllm_colon_lint(line: &str) -> bool {
    line.strip_prefix("vllm:")
        .and_then(|rest| rest.strip_suffix(" metric names should not contain ':'"))
        .is_some_and(|name| {
            name.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        })
}

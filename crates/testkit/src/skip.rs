//! How a test that cannot run here says so: one line on the terminal even when the test passes,
//! and a line in the run's list of skips, which `tests/run` prints at the end.
//!
//! libtest captures what a passing test prints with `eprintln!`, so a skip reported that way is
//! seen by nobody and reads as a pass. The line is written to the process's stderr directly,
//! which the capture does not intercept. Under `CI=true` a test whose prerequisite is missing
//! fails instead ([`crate::in_ci`]); each test decides that before it skips.

use std::io::Write;

/// The variable naming the file each skip is appended to (`tests/run` sets it and prints the
/// file after `cargo test`).
pub const LIST_VAR: &str = "TOKENMETER_SKIPPED_LIST";

/// The running test's name, as libtest names its thread (`module::test`), for a skip reported
/// from a helper the test called.
pub fn current_test() -> String {
    std::thread::current()
        .name()
        .unwrap_or("a test on an unnamed thread")
        .to_string()
}

/// Reports that `test` did not run because of `why` (which says what to set or install to run
/// it): `SKIPPED <test>: <why>` on stderr, and in the list when [`LIST_VAR`] names one.
pub fn skip(test: &str, why: &str) {
    let line = format!("SKIPPED {test}: {why}\n");
    // Both writes are best effort: a skip that cannot be reported must not fail the test.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
    if let Some(path) = std::env::var_os(LIST_VAR) {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = f.write_all(line.as_bytes());
        }
    }
}

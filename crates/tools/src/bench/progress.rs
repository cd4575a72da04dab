//! A one-line progress bar on stderr while a level runs, redrawn a few times a second.
//!
//! It is drawn only when stderr is a terminal: in CI logs and pipes a bar is noise (and carriage
//! returns garble files), and the results table on stdout already says everything. Workers only
//! bump atomic counters in a [`Live`]; the drawing runs on its own task, off the request path.

use std::io::{IsTerminal, Write};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::live::Live;
use super::load::Stop;

/// How often the bar is redrawn.
const TICK: Duration = Duration::from_millis(200);

/// Width of the bar itself, in characters.
const BAR: usize = 24;

/// Draws bars, or nothing when stderr is not a terminal.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    enabled: bool,
}

impl Progress {
    pub fn new() -> Self {
        Progress {
            enabled: std::io::stderr().is_terminal(),
        }
    }

    /// A progress bar that never draws.
    pub fn disabled() -> Self {
        Progress { enabled: false }
    }

    /// Starts drawing one level's bar; it is cleared when the returned [`Bar`] is dropped.
    /// Without a budget (a trace replayed to its end) it shows the time and the counts.
    pub fn level(&self, label: String, stop: Option<Stop>, live: Arc<Live>) -> Bar {
        if !self.enabled {
            return Bar { task: None };
        }
        let started = Instant::now();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(TICK);
            loop {
                tick.tick().await;
                let line = render(&label, stop, &live, started.elapsed());
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r\x1b[2K{line}");
                let _ = err.flush();
            }
        });
        Bar { task: Some(task) }
    }
}

impl Default for Progress {
    fn default() -> Self {
        Progress::new()
    }
}

/// A bar being drawn; dropping it stops the drawing and clears the line.
pub struct Bar {
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Bar {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}

/// The text of the bar: the level, how far it is, and what has come back so far.
pub fn render(label: &str, stop: Option<Stop>, live: &Live, elapsed: Duration) -> String {
    let done = live.done.load(Ordering::Relaxed);
    let tokens = live.tokens.load(Ordering::Relaxed);
    let errors = live.errors.load(Ordering::Relaxed);
    let (fraction, budget) = match stop {
        Some(Stop::After(d)) => (
            elapsed.as_secs_f64() / d.as_secs_f64().max(1e-9),
            format!("{:.0}s/{:.0}s", elapsed.as_secs_f64(), d.as_secs_f64()),
        ),
        Some(Stop::Requests(n)) => (done as f64 / n.max(1) as f64, format!("{done}/{n}")),
        None => {
            let sent = live.sent.load(Ordering::Relaxed);
            return format!(
                "{label} {:.0}s  sent {sent}  done {done}  errors {errors}  {tokens} tokens",
                elapsed.as_secs_f64()
            );
        }
    };
    let filled = ((fraction.clamp(0.0, 1.0) * BAR as f64).round() as usize).min(BAR);
    format!(
        "{label} [{}{}] {budget}  done {done}  errors {errors}  {tokens} tokens",
        "#".repeat(filled),
        "-".repeat(BAR - filled),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test that unwraps fails loudly, which is its job
mod tests {
    use super::*;

    #[test]
    fn bar_shows_progress_of_either_budget() {
        let live = Live::default();
        live.done.store(5, Ordering::Relaxed);
        live.tokens.store(640, Ordering::Relaxed);
        let line = render(
            "c=4",
            Some(Stop::Requests(10)),
            &live,
            Duration::from_secs(1),
        );
        assert_eq!(
            line,
            format!(
                "c=4 [{}{}] 5/10  done 5  errors 0  640 tokens",
                "#".repeat(12),
                "-".repeat(12)
            )
        );
        let line = render(
            "c=4",
            Some(Stop::After(Duration::from_secs(30))),
            &live,
            Duration::from_secs(60),
        );
        assert!(
            line.starts_with(&format!("c=4 [{}] 60s/30s", "#".repeat(BAR))),
            "{line}"
        );
        live.sent.store(7, Ordering::Relaxed);
        let line = render("trace x1", None, &live, Duration::from_secs(3));
        assert_eq!(line, "trace x1 3s  sent 7  done 5  errors 0  640 tokens");
    }
}

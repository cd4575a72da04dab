//! What the reader last learned of the engine, kept for whoever exports it.
//!
//! The reader writes here after each read; the metrics read it when `/metrics` is rendered
//! ([`crate::metrics`]'s engine-view families), as they read the capacity model. So the reader
//! knows no metric, and the metrics know no HTTP.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::view::EngineView;

/// How one read of the engine's page ended: the `result` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScrapeResult {
    Ok,
    Timeout,
    ConnectError,
    /// An answer that was not 200 (a 404: the engine has no `/metrics`).
    HttpError,
    /// A page over the size limit; it is not read further.
    TooLarge,
    /// A page in no dialect known here.
    UnknownDialect,
}

impl ScrapeResult {
    pub const ALL: [ScrapeResult; 6] = [
        ScrapeResult::Ok,
        ScrapeResult::Timeout,
        ScrapeResult::ConnectError,
        ScrapeResult::HttpError,
        ScrapeResult::TooLarge,
        ScrapeResult::UnknownDialect,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ScrapeResult::Ok => "ok",
            ScrapeResult::Timeout => "timeout",
            ScrapeResult::ConnectError => "connect_error",
            ScrapeResult::HttpError => "http_error",
            ScrapeResult::TooLarge => "too_large",
            ScrapeResult::UnknownDialect => "unknown_dialect",
        }
    }
}

/// The reader's findings.
#[derive(Debug, Default)]
pub struct Observed {
    /// The last good view, until it is stale; `None` then, and before the first.
    view: Mutex<Option<EngineView>>,
    /// Reads by result, in [`ScrapeResult::ALL`]'s order.
    scrapes: [AtomicU64; 6],
    /// Preemptions counted since this process first read the engine's counter: the sum of its
    /// increases (a count that went down, a restart, adds nothing); `None` before that.
    preemptions: Mutex<Preemptions>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Preemptions {
    engine_last: Option<f64>,
    counted: u64,
}

impl Observed {
    /// A read ended with `result`.
    pub fn scraped(&self, result: ScrapeResult) {
        if let Some(i) = ScrapeResult::ALL.iter().position(|r| *r == result) {
            self.scrapes[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A good read: `view` is the engine now.
    pub fn saw(&self, view: EngineView) {
        if let Some(now) = view.preemptions_total {
            let mut p = self.preemptions.lock().unwrap_or_else(|e| e.into_inner());
            let added = p.engine_last.map_or(0.0, |before| (now - before).max(0.0));
            p.counted = p.counted.saturating_add(added.min(u64::MAX as f64) as u64);
            p.engine_last = Some(now);
        }
        *self.view.lock().unwrap_or_else(|e| e.into_inner()) = Some(view);
    }

    /// The last view is too old to show.
    pub fn stale(&self) {
        *self.view.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// The last good view, unless stale.
    pub fn view(&self) -> Option<EngineView> {
        *self.view.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads so far by result.
    pub fn scrapes(&self) -> [(ScrapeResult, u64); 6] {
        let mut out = [(ScrapeResult::Ok, 0); 6];
        for (i, r) in ScrapeResult::ALL.iter().enumerate() {
            out[i] = (*r, self.scrapes[i].load(Ordering::Relaxed));
        }
        out
    }

    /// Preemptions counted, once the engine has stated its counter.
    pub fn preemptions(&self) -> Option<u64> {
        let p = *self.preemptions.lock().unwrap_or_else(|e| e.into_inner());
        p.engine_last.map(|_| p.counted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preemptions_add_up_across_reads_and_restarts() {
        let o = Observed::default();
        assert_eq!(o.preemptions(), None);
        let at = |n: f64| EngineView {
            preemptions_total: Some(n),
            ..EngineView::default()
        };
        // The first read is the baseline: what the engine counted before is not ours.
        o.saw(at(10.0));
        assert_eq!(o.preemptions(), Some(0));
        o.saw(at(14.0));
        // A restart (the count goes down) adds nothing; after it, increases count again.
        o.saw(at(2.0));
        o.saw(at(5.0));
        assert_eq!(o.preemptions(), Some(7));
        assert!(o.view().is_some());
        o.stale();
        assert_eq!(o.view(), None);
        o.scraped(ScrapeResult::Timeout);
        o.scraped(ScrapeResult::Timeout);
        assert_eq!(o.scrapes()[1], (ScrapeResult::Timeout, 2));
    }
}

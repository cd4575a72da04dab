//! The capacity model's own clock: it refits in the background and publishes what it found,
//! and everyone who shows or uses an answer (`/metrics`, the page, the GPU-time books) reads
//! the last one published. No fit runs inside a scrape, and a proxy nobody scrapes still hands
//! the books fitted prices.
//!
//! Two paces. A full refit, with the answers' replays, every [`REFIT_INTERVAL`]. Until the
//! GPU-time split has both its costs (the step, and the prefill fit believed), the costs alone
//! are read every [`FIRST_RATES_EVERY`] between refits: a refit of a window with little in it
//! takes microseconds, and until then every request is split by the equal share alone. A
//! refit runs early when someone waits for one ([`Capacity::next_report`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Capacity, Report, REFIT_INTERVAL};

/// How often the costs are read until the split has both: see the module's doc.
pub const FIRST_RATES_EVERY: Duration = Duration::from_millis(500);

/// What the process runs beside its listeners: refits on [`REFIT_INTERVAL`], reads the costs on
/// [`FIRST_RATES_EVERY`] until they are known, and answers [`Capacity::next_report`] at once.
pub async fn run(capacity: Arc<Capacity>) {
    let mut known = false;
    let mut next_refit = Instant::now() + REFIT_INTERVAL;
    loop {
        let now = Instant::now();
        let wait = if known {
            next_refit.saturating_duration_since(now)
        } else {
            FIRST_RATES_EVERY.min(next_refit.saturating_duration_since(now))
        };
        let asked = tokio::select! {
            _ = tokio::time::sleep(wait) => false,
            _ = capacity.asked.notified() => true,
        };
        let now = Instant::now();
        let full = asked || now >= next_refit;
        if full {
            next_refit = now + REFIT_INTERVAL;
        }
        // A refit is milliseconds of CPU (the answers' replays): on a blocking thread, so no
        // worker that moves streams' bytes waits for it.
        let c = Arc::clone(&capacity);
        let prefill = tokio::task::spawn_blocking(move || {
            if full {
                c.publish_report(now).prefill.is_some()
            } else {
                // The costs alone: the answers' replays wait for the refit's turn.
                c.refresh_rates(now)
            }
        })
        .await
        .unwrap_or(false);
        // Known once both the step and the prefill are (or prompts are too short to cost
        // anything).
        known = capacity.rates().is_some() && prefill;
    }
}

impl Capacity {
    /// The last report published: what `/metrics` and the page show. Never refits.
    pub fn report(&self) -> Arc<Report> {
        match &*self.published.borrow() {
            Some((_, r)) => Arc::clone(r),
            // Published at construction: never reached, but the type cannot say so.
            None => Arc::new(self.refit(Instant::now())),
        }
    }

    /// Asks the background refit for a report of the window up to now and waits for it: what
    /// a caller that has just finished a load does (a test, the demo), instead of waiting out
    /// the interval. Waits forever where nothing runs [`run`].
    pub async fn next_report(&self) -> Arc<Report> {
        let asked_at = Instant::now();
        let mut rx = self.published.subscribe();
        self.asked.notify_one();
        // A refit already under way when it asked fitted less than it asks for.
        let _ = rx
            .wait_for(|p| p.as_ref().is_some_and(|(at, _)| *at >= asked_at))
            .await;
        self.report()
    }

    /// Refits the window that ends at `now` and publishes it as the report everyone reads.
    pub fn publish_report(&self, now: Instant) -> Arc<Report> {
        let r = Arc::new(self.refit(now));
        self.published.send_replace(Some((now, Arc::clone(&r))));
        r
    }
}

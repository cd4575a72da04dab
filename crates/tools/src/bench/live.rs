//! The counters one level's workers bump as requests end: what the progress bar draws while the
//! level runs. Apart from both, so the load writes them and the bar reads them without either
//! importing the other.

use std::sync::atomic::{AtomicU64, Ordering};

use super::client::Sample;

/// Counters the workers of one level update as requests end.
#[derive(Debug, Default)]
pub struct Live {
    pub sent: AtomicU64,
    pub done: AtomicU64,
    pub errors: AtomicU64,
    pub tokens: AtomicU64,
}

impl Live {
    pub fn record(&self, s: &Sample) {
        self.done.fetch_add(1, Ordering::Relaxed);
        if !s.is_ok() {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        self.tokens.fetch_add(s.output_tokens(), Ordering::Relaxed);
    }
}

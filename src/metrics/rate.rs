//! Output tokens over a sliding window: the aggregate tokens/s gauges, refreshed at each scrape.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Output tokens counted over a sliding window, for the aggregate tokens/s gauges.
#[derive(Debug)]
pub struct RateWindow {
    origin: Instant,
    window: Duration,
    slot: Duration,
    /// (slot number, tokens) ring; a slot is reused once its number is out of the window.
    slots: Mutex<Vec<(u64, u64)>>,
}

/// The window is kept in this many slots: the gauge moves in steps of window / SLOTS.
const RATE_SLOTS: u32 = 50;

impl RateWindow {
    pub fn new(window: Duration) -> Self {
        let window = window.max(Duration::from_millis(RATE_SLOTS as u64));
        RateWindow {
            origin: Instant::now(),
            window,
            slot: window / RATE_SLOTS,
            slots: Mutex::new(vec![(u64::MAX, 0); RATE_SLOTS as usize]),
        }
    }

    fn slot_of(&self, at: Instant) -> u64 {
        (at.saturating_duration_since(self.origin).as_nanos() / self.slot.as_nanos()) as u64
    }

    /// Counts `tokens` produced at `at`.
    pub fn add(&self, tokens: u64, at: Instant) {
        let n = self.slot_of(at);
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let cell = &mut slots[(n % RATE_SLOTS as u64) as usize];
        if cell.0 != n {
            *cell = (n, 0);
        }
        cell.1 += tokens;
    }

    /// Tokens per second over the window that ends at `now`.
    pub fn rate(&self, now: Instant) -> f64 {
        let n = self.slot_of(now);
        let oldest = n.saturating_sub(RATE_SLOTS as u64 - 1);
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let total: u64 = slots
            .iter()
            .filter(|(s, _)| *s != u64::MAX && *s >= oldest && *s <= n)
            .map(|(_, t)| t)
            .sum();
        total as f64 / self.window.as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_window_forgets_old_tokens() {
        let w = RateWindow::new(Duration::from_secs(10));
        let t0 = w.origin;
        w.add(100, t0);
        w.add(100, t0 + Duration::from_secs(5));
        assert_eq!(w.rate(t0 + Duration::from_secs(5)), 20.0);
        assert_eq!(w.rate(t0 + Duration::from_millis(10_100)), 10.0);
        assert_eq!(w.rate(t0 + Duration::from_secs(30)), 0.0);
    }
}

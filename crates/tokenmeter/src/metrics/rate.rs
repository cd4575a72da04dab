//! Output tokens over a sliding window: the aggregate tokens/s gauges, refreshed at each scrape.
//!
//! Every token-bearing event of every stream adds to the window, so adding takes no lock: each
//! slot is one atomic word holding the slot's number and its tokens, changed by compare and swap.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Output tokens counted over a sliding window, for the aggregate tokens/s gauges.
#[derive(Debug)]
pub struct RateWindow {
    origin: Instant,
    window: Duration,
    slot: Duration,
    /// A ring of cells, each `(slot number << TOKEN_BITS) | tokens` (see [`pack`]); a cell is
    /// reused once its slot is out of the window. `EMPTY` until first used.
    cells: Vec<AtomicU64>,
}

/// The window is kept in this many slots: the gauge moves in steps of window / SLOTS.
const RATE_SLOTS: u32 = 50;
/// Bits of a cell that count tokens: 2^32 tokens in one slot (at least 1 ms) is far beyond any
/// server; the count saturates there rather than spill into the slot number.
const TOKEN_BITS: u32 = 32;
const TOKEN_MAX: u64 = (1 << TOKEN_BITS) - 1;
/// A cell no slot has used yet.
const EMPTY: u64 = u64::MAX;

/// A cell's word: the slot number (its low 32 bits: with slots of at least 1 ms they repeat
/// after 49 days, and a cell is rewritten every window, so two slots a wrap apart never meet in
/// one cell) and the tokens.
fn pack(slot: u64, tokens: u64) -> u64 {
    // One below the maximum, so a full cell is never mistaken for `EMPTY`.
    ((slot & TOKEN_MAX) << TOKEN_BITS) | tokens.min(TOKEN_MAX - 1)
}

fn slot_tag(word: u64) -> u64 {
    word >> TOKEN_BITS
}

impl RateWindow {
    pub fn new(window: Duration) -> Self {
        let window = window.max(Duration::from_millis(RATE_SLOTS as u64));
        RateWindow {
            origin: Instant::now(),
            window,
            slot: window / RATE_SLOTS,
            cells: (0..RATE_SLOTS).map(|_| AtomicU64::new(EMPTY)).collect(),
        }
    }

    fn slot_of(&self, at: Instant) -> u64 {
        (at.saturating_duration_since(self.origin).as_nanos() / self.slot.as_nanos()) as u64
    }

    /// Counts `tokens` produced at `at`.
    pub fn add(&self, tokens: u64, at: Instant) {
        let n = self.slot_of(at);
        let cell = &self.cells[(n % RATE_SLOTS as u64) as usize];
        let mut cur = cell.load(Ordering::Relaxed);
        loop {
            // How far the cell's slot is ahead of ours, modulo the tag's width.
            let ahead = slot_tag(cur).wrapping_sub(n & TOKEN_MAX) & TOKEN_MAX;
            let next = if cur == EMPTY || ahead > TOKEN_MAX / 2 {
                // Unused, or an older slot's: ours now.
                pack(n, tokens)
            } else if ahead == 0 {
                pack(n, (cur & TOKEN_MAX).saturating_add(tokens))
            } else {
                // The cell already holds a later slot: these tokens (read from a clock taken
                // before another stream's) are older than the window.
                return;
            };
            match cell.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(now) => cur = now,
            }
        }
    }

    /// Tokens per second over the window that ends at `now`.
    pub fn rate(&self, now: Instant) -> f64 {
        let n = self.slot_of(now);
        let oldest = n.saturating_sub(RATE_SLOTS as u64 - 1);
        let total: u64 = self
            .cells
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .filter(|&w| w != EMPTY)
            .filter(|&w| {
                // The cell's slot, in full: the one at or before `n` with the same low bits.
                let back = (n & TOKEN_MAX).wrapping_sub(slot_tag(w)) & TOKEN_MAX;
                n.checked_sub(back).is_some_and(|s| s >= oldest)
            })
            .map(|w| w & TOKEN_MAX)
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

    #[test]
    fn tokens_from_an_older_clock_reading_do_not_reset_a_newer_slot() {
        let w = RateWindow::new(Duration::from_secs(10));
        let t0 = w.origin;
        // Slot 50 shares its cell with slot 0; a late add for slot 0 must not wipe it.
        w.add(7, t0 + Duration::from_secs(10));
        w.add(5, t0);
        assert_eq!(w.rate(t0 + Duration::from_secs(10)), 0.7);
    }

    #[test]
    fn adds_from_many_threads_are_all_counted() {
        let w = std::sync::Arc::new(RateWindow::new(Duration::from_secs(10)));
        let t0 = w.origin;
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let w = std::sync::Arc::clone(&w);
                std::thread::spawn(move || {
                    for i in 0..10_000u64 {
                        w.add(1, t0 + Duration::from_millis(i % 5_000));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        assert_eq!(w.rate(t0 + Duration::from_secs(5)), 4.0 * 10_000.0 / 10.0);
    }

    #[test]
    fn slot_numbers_wrap_without_losing_a_cell() {
        assert_eq!(slot_tag(pack(TOKEN_MAX + 3, 9)), 2);
        assert_eq!(pack(TOKEN_MAX, TOKEN_MAX) & TOKEN_MAX, TOKEN_MAX - 1);
        assert_ne!(pack(TOKEN_MAX, u64::MAX), EMPTY);
    }
}

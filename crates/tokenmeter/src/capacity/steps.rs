//! The step window: the bounded record of (decoding concurrency, time per token) over a sliding
//! window, the samples the decode fit reads.
//!
//! For each integer concurrency 1..=[`MAX_CONCURRENCY`] it keeps a ring of [`SLOTS`] time slots,
//! each a fixed histogram of time per token ([`super::bins`]); the window is the sum of the
//! slots still inside it, so it slides in steps of window / [`SLOTS`]. A concurrency's slots are
//! allocated the first time that concurrency is seen and never again: memory depends on how many
//! distinct concurrencies occurred (at most [`MAX_CONCURRENCY`]), never on how much traffic
//! there was.
//!
//! A push is a few atomic operations and no lock, because it happens on every token-bearing
//! event of every stream. A slot is reused for a later time by the first push that finds it
//! stale: it claims the slot with a compare-and-swap on its epoch and zeroes the counts. Another
//! push racing with that zeroing may lose its count or have it land in the new epoch; that is a
//! handful of events at a slot boundary, once per slot length, and a median does not notice.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::bins::{self, BINS};

/// Concurrencies told apart: 1 to 256, the band edges of the concurrency labels. Samples from a
/// higher concurrency are dropped and counted ([`StepWindow::dropped`]), not clamped: piling 300,
/// 500 and 1,000 onto 256 would put a wrong point into the fit.
pub const MAX_CONCURRENCY: usize = 256;

/// Slots per window: the window slides in steps of a tenth of its length (90 s for 15 min),
/// fine enough for a window meant to average over minutes of traffic.
pub const SLOTS: usize = 10;

/// The shortest window accepted: one second per slot.
pub const MIN_WINDOW: Duration = Duration::from_secs(SLOTS as u64);

/// One time slot of one concurrency.
struct Slot {
    /// The slot number (time since `origin` / slot length) plus one; 0 for never used.
    epoch: AtomicU64,
    counts: [AtomicU32; BINS],
}

/// All slots of one concurrency.
type Ring = [Slot; SLOTS];

/// The step window. See the module documentation.
pub struct StepWindow {
    origin: Instant,
    slot: Duration,
    /// Index: concurrency - 1.
    rings: Box<[OnceLock<Box<Ring>>]>,
    dropped: AtomicU64,
}

/// The window's samples at one concurrency.
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    pub concurrency: u32,
    /// Token-weighted samples in the window.
    pub samples: u64,
    /// The median time per token, in seconds.
    pub median: f64,
    /// The samples' robust standard deviation ([`bins::spread`]), in seconds: how precise the
    /// median is, for the fit's judgement of its own slope.
    pub spread: f64,
}

impl StepWindow {
    /// An empty step window over `window` (at least [`MIN_WINDOW`]).
    pub fn new(window: Duration, origin: Instant) -> Self {
        let window = window.max(MIN_WINDOW);
        StepWindow {
            origin,
            slot: window / SLOTS as u32,
            rings: (0..MAX_CONCURRENCY).map(|_| OnceLock::new()).collect(),
            dropped: AtomicU64::new(0),
        }
    }

    fn epoch(&self, at: Instant) -> u64 {
        let n = at.saturating_duration_since(self.origin).as_nanos() / self.slot.as_nanos().max(1);
        u64::try_from(n).unwrap_or(u64::MAX - 1) + 1
    }

    /// Records `tokens` tokens that took `seconds_per_token` each while `concurrency` requests
    /// were decoding, at `at`. Concurrency is rounded to the nearest integer (a mean over a gap
    /// can be fractional) and at least 1 (the stream itself was decoding).
    pub fn push(&self, concurrency: f64, seconds_per_token: f64, tokens: u32, at: Instant) {
        let (Some(bin), true) = (bins::index(seconds_per_token), concurrency.is_finite()) else {
            return;
        };
        if tokens == 0 {
            return;
        }
        let c = concurrency.round().max(1.0);
        if c > MAX_CONCURRENCY as f64 {
            self.dropped.fetch_add(u64::from(tokens), Ordering::Relaxed);
            return;
        }
        let ring = self.rings[c as usize - 1].get_or_init(new_ring);
        let epoch = self.epoch(at);
        let slot = &ring[(epoch % SLOTS as u64) as usize];
        let seen = slot.epoch.load(Ordering::Acquire);
        if seen != epoch {
            if seen > epoch {
                // A push from a time whose slot was already reused: it is out of the window.
                return;
            }
            if slot
                .epoch
                .compare_exchange(seen, epoch, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                for c in &slot.counts {
                    c.store(0, Ordering::Relaxed);
                }
            }
        }
        slot.counts[bin].fetch_add(tokens, Ordering::Relaxed);
    }

    /// Samples from above [`MAX_CONCURRENCY`], dropped since the start.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Every concurrency with samples in the window that ends at `now`, ascending.
    pub fn columns(&self, now: Instant) -> Vec<Column> {
        let newest = self.epoch(now);
        let oldest = newest.saturating_sub(SLOTS as u64 - 1).max(1);
        let mut out = Vec::new();
        let mut sum = [0u64; BINS];
        for (i, ring) in self.rings.iter().enumerate() {
            let Some(ring) = ring.get() else { continue };
            sum.fill(0);
            for slot in ring.iter() {
                let e = slot.epoch.load(Ordering::Acquire);
                if e < oldest || e > newest {
                    continue;
                }
                for (s, c) in sum.iter_mut().zip(&slot.counts) {
                    *s += u64::from(c.load(Ordering::Relaxed));
                }
            }
            if let Some(median) = bins::median(&sum) {
                out.push(Column {
                    concurrency: i as u32 + 1,
                    samples: sum.iter().sum(),
                    median,
                    spread: bins::spread(&sum).unwrap_or(0.0),
                });
            }
        }
        out
    }

    /// Bytes this window holds on the heap: the table of rings and the rings allocated so far.
    /// It is what the memory test watches (the window allocates nothing else).
    pub fn heap_bytes(&self) -> usize {
        let table = self.rings.len() * std::mem::size_of::<OnceLock<Box<Ring>>>();
        table + self.allocated_rings() * std::mem::size_of::<Ring>()
    }

    /// Concurrencies whose ring has been allocated.
    pub fn allocated_rings(&self) -> usize {
        self.rings.iter().filter(|r| r.get().is_some()).count()
    }
}

fn new_ring() -> Box<Ring> {
    Box::new(std::array::from_fn(|_| Slot {
        epoch: AtomicU64::new(0),
        counts: std::array::from_fn(|_| AtomicU32::new(0)),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn the_median_per_concurrency_comes_from_the_window_only() {
        let t0 = Instant::now();
        let s = StepWindow::new(10 * MINUTE, t0);
        for _ in 0..100 {
            s.push(4.0, 0.012, 1, t0);
            s.push(4.4, 0.012, 1, t0);
            s.push(7.6, 0.020, 2, t0);
        }
        let cols = s.columns(t0);
        assert_eq!(cols.len(), 2);
        assert_eq!((cols[0].concurrency, cols[0].samples), (4, 200));
        assert_eq!((cols[1].concurrency, cols[1].samples), (8, 200));
        assert!((cols[0].median / 0.012 - 1.0).abs() < 0.03);
        // Nine minutes later the samples are still inside the ten-minute window...
        s.push(4.0, 0.5, 1, t0 + 9 * MINUTE);
        assert_eq!(s.columns(t0 + 9 * MINUTE)[0].samples, 201);
        // ...eleven minutes later, the first minute's have left it.
        let cols = s.columns(t0 + 11 * MINUTE);
        assert_eq!(cols.len(), 1);
        assert_eq!((cols[0].concurrency, cols[0].samples), (4, 1));
        // A slot reused by a later time starts from zero.
        s.push(4.0, 0.012, 1, t0 + 20 * MINUTE);
        assert_eq!(s.columns(t0 + 20 * MINUTE)[0].samples, 1);
    }

    #[test]
    fn concurrency_above_the_limit_is_dropped_and_nonsense_is_ignored() {
        let t0 = Instant::now();
        let s = StepWindow::new(MINUTE, t0);
        s.push(256.4, 0.01, 1, t0);
        s.push(300.0, 0.01, 3, t0);
        s.push(0.2, 0.01, 1, t0);
        s.push(f64::NAN, 0.01, 1, t0);
        s.push(2.0, f64::NAN, 1, t0);
        s.push(2.0, -1.0, 1, t0);
        s.push(2.0, 0.01, 0, t0);
        let got: Vec<(u32, u64)> = s
            .columns(t0)
            .iter()
            .map(|c| (c.concurrency, c.samples))
            .collect();
        assert_eq!(got, [(1, 1), (256, 1)]);
        assert_eq!(s.dropped(), 3);
    }

    // The window's memory stays flat over 1,000,000 token events.
    #[test]
    fn memory_stays_flat_over_a_million_token_events() {
        let t0 = Instant::now();
        let s = StepWindow::new(15 * MINUTE, t0);
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            // xorshift: a cheap deterministic stream.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut after_first_pass = 0;
        for i in 0..1_000_000u64 {
            let c = 1 + next() % 64;
            let t = 0.010 + 0.0005 * c as f64 + (next() % 1000) as f64 * 1e-6;
            // The stream spans two hours, so every slot is reused many times.
            let at = t0 + Duration::from_millis(i * 7);
            s.push(c as f64, t, 1, at);
            if i == 10_000 {
                after_first_pass = s.heap_bytes();
            }
        }
        assert_eq!(s.allocated_rings(), 64);
        assert_eq!(s.heap_bytes(), after_first_pass);
        // The bound: every concurrency allocated.
        let bound = MAX_CONCURRENCY
            * (std::mem::size_of::<OnceLock<Box<Ring>>>() + std::mem::size_of::<Ring>());
        assert!(s.heap_bytes() <= bound);
        // The window holds the last 15 minutes only: 900 s / 7 ms, within a slot's worth.
        let end = t0 + Duration::from_millis(1_000_000 * 7);
        let n: u64 = s.columns(end).iter().map(|c| c.samples).sum();
        assert!((115_000..=130_000).contains(&n), "{n}");
    }
}

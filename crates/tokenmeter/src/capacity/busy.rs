//! The mean decoding concurrency over the last minute, the numerator of utilization.
//!
//! It is measured, not sampled: every gap between two token-bearing events of a stream is time
//! that stream spent decoding, so the sum of the gaps that ended in a minute, divided by the
//! minute, is the time-weighted mean number of streams decoding in it (a gap that straddles a
//! second's edge counts in the second it ended in, which moves the mean by at most one gap per
//! stream). Kept as sixty one-second slots of atomic sums: no lock on the per-event path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The span utilization is averaged over: the "last minute".
pub const SPAN: Duration = Duration::from_secs(60);

const SLOTS: usize = SPAN.as_secs() as usize;

struct Slot {
    /// Second since `origin`, plus one; 0 for never used.
    epoch: AtomicU64,
    nanos: AtomicU64,
}

/// Decoding time per second over the last [`SPAN`].
pub struct Busy {
    origin: Instant,
    slots: [Slot; SLOTS],
}

impl Busy {
    pub fn new(origin: Instant) -> Self {
        Busy {
            origin,
            slots: std::array::from_fn(|_| Slot {
                epoch: AtomicU64::new(0),
                nanos: AtomicU64::new(0),
            }),
        }
    }

    fn epoch(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.origin).as_secs() + 1
    }

    /// A stream spent `gap` decoding, up to `at`.
    pub fn add(&self, gap: Duration, at: Instant) {
        let epoch = self.epoch(at);
        let slot = &self.slots[(epoch % SLOTS as u64) as usize];
        let seen = slot.epoch.load(Ordering::Acquire);
        if seen > epoch {
            return;
        }
        if seen != epoch
            && slot
                .epoch
                .compare_exchange(seen, epoch, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            slot.nanos.store(0, Ordering::Relaxed);
        }
        let nanos = u64::try_from(gap.as_nanos()).unwrap_or(u64::MAX);
        slot.nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The mean number of streams decoding over the last [`SPAN`] of complete seconds before
    /// `now` (over the whole life so far when that is shorter).
    pub fn mean(&self, now: Instant) -> f64 {
        let current = self.epoch(now);
        let oldest = current.saturating_sub(SLOTS as u64).max(1);
        let total: u64 = self
            .slots
            .iter()
            .filter(|s| {
                let e = s.epoch.load(Ordering::Acquire);
                e >= oldest && e < current
            })
            .map(|s| s.nanos.load(Ordering::Relaxed))
            .sum();
        let span = (current - oldest) as f64;
        if span > 0.0 {
            total as f64 / 1e9 / span
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mean_is_decoding_time_over_the_last_minute() {
        let t0 = Instant::now();
        let b = Busy::new(t0);
        // Three streams decoding through 100 s, each a token every 20 ms.
        for ms in (20..100_000u64).step_by(20) {
            for _ in 0..3 {
                b.add(Duration::from_millis(20), t0 + Duration::from_millis(ms));
            }
        }
        let m = b.mean(t0 + Duration::from_secs(100));
        assert!((m - 3.0).abs() < 1e-9, "{m}");
        // Half a minute of silence halves it; two minutes empty it.
        let m = b.mean(t0 + Duration::from_secs(130));
        assert!((m - 1.5).abs() < 1e-9, "{m}");
        assert_eq!(b.mean(t0 + Duration::from_secs(300)), 0.0);
        // Ten seconds into the life, the mean is over those ten seconds.
        let b = Busy::new(t0);
        for s in 0..10u64 {
            b.add(
                Duration::from_secs(2),
                t0 + Duration::from_millis(s * 1000 + 500),
            );
        }
        let m = b.mean(t0 + Duration::from_secs(10));
        assert!((m - 2.0).abs() < 1e-9, "{m}");
    }
}

//! Concurrency, measured rather than sampled: the time integral of the number of requests in
//! flight, so the mean over any request's decode window is a subtraction of two [`Snapshot`]s.

use std::sync::Mutex;
use std::time::Instant;

/// The time integral of the number of requests in flight.
#[derive(Debug)]
pub struct Concurrency {
    state: Mutex<ConcurrencyState>,
}

#[derive(Debug)]
struct ConcurrencyState {
    origin: Instant,
    last: Instant,
    in_flight: u64,
    /// Sum of in_flight x seconds since `origin`, up to `last`.
    integral: f64,
}

impl Default for Concurrency {
    fn default() -> Self {
        let now = Instant::now();
        Concurrency {
            state: Mutex::new(ConcurrencyState {
                origin: now,
                last: now,
                in_flight: 0,
                integral: 0.0,
            }),
        }
    }
}

/// The concurrency tracker's state at one instant.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot {
    /// The instant the integral runs to: the time asked for, or a later one when another
    /// request had already moved the tracker past it (the clock is read before the lock).
    pub at: Instant,
    /// Requests x seconds up to `at`.
    pub integral: f64,
    /// Requests in flight at `at`.
    pub in_flight: u64,
}

impl Snapshot {
    /// The time-weighted mean number of requests in flight from `self` to `later`. Both ends
    /// use the tracker's own instants: mixing the caller's clock readings with integrals that
    /// ran to a later instant made short (bursty) windows look idle. A window of no length has
    /// the number in flight at its end.
    pub fn mean_until(&self, later: &Snapshot) -> f64 {
        let span = later.at.saturating_duration_since(self.at).as_secs_f64();
        if span > 0.0 {
            (later.integral - self.integral) / span
        } else {
            later.in_flight as f64
        }
    }
}

impl Concurrency {
    /// Moves the tracker to `now` and changes the number in flight by `delta`.
    pub fn update(&self, now: Instant, delta: i64) -> Snapshot {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = now.max(s.last);
        s.integral += s.in_flight as f64 * (now - s.last).as_secs_f64();
        s.last = now;
        s.in_flight = s.in_flight.saturating_add_signed(delta);
        Snapshot {
            at: now,
            integral: s.integral,
            in_flight: s.in_flight,
        }
    }

    /// The tracker at `now` (or just after, see [`Snapshot::at`]).
    pub fn snapshot(&self, now: Instant) -> Snapshot {
        self.update(now, 0)
    }

    /// Requests in flight right now.
    pub fn current(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .in_flight
    }

    /// Seconds since this tracker was created (for rates over its whole life).
    pub fn age(&self, now: Instant) -> f64 {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        now.saturating_duration_since(s.origin).as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn concurrency_integral_is_exact() {
        let c = Concurrency::default();
        let t0 = Instant::now();
        c.update(t0, 1);
        c.update(t0 + Duration::from_secs(1), 1);
        c.update(t0 + Duration::from_secs(3), -2);
        // 1 request for 1 s, then 2 for 2 s, then none.
        let i = c.snapshot(t0 + Duration::from_secs(10)).integral;
        assert!((i - 5.0).abs() < 1e-9, "{i}");
        assert_eq!(c.current(), 0);
    }

    // Regression: behind a real vLLM at concurrency 16, a response whose tokens arrived in a
    // burst landed in band `1`. Its clock readings were older than the tracker's latest update,
    // so both integrals ran to the same later instant: no area over a non-zero decode time.
    #[test]
    fn a_window_read_behind_the_trackers_clock_keeps_its_concurrency() {
        let c = Concurrency::default();
        let t0 = Instant::now();
        for _ in 0..16 {
            c.update(t0, 1);
        }
        // Another request moved the tracker to t0 + 10 ms before our two readings were taken.
        c.update(t0 + Duration::from_millis(10), -1);
        c.update(t0 + Duration::from_millis(10), 1);
        let first = c.snapshot(t0 + Duration::from_millis(2));
        let last = c.snapshot(t0 + Duration::from_millis(3));
        assert_eq!(first.mean_until(&last), 16.0);
        // An ordinary window: 16 for 10 ms, then 8 for 10 ms.
        let later = {
            for _ in 0..8 {
                c.update(t0 + Duration::from_millis(20), -1);
            }
            c.snapshot(t0 + Duration::from_millis(30))
        };
        let m = first.mean_until(&later);
        assert!((m - 12.0).abs() < 1e-9, "{m}");
    }
}

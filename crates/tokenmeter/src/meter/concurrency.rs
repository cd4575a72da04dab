//! Concurrency, measured rather than sampled: the time integral of the number of requests in
//! flight, so the mean over any request's decode window is a subtraction of two [`Snapshot`]s.
//!
//! The tracker changes only when a request enters or leaves, but it is read at every
//! token-bearing event of every stream (the decode window's ends). So reading takes no lock and
//! writes nothing shared: the state is a sequence lock over atomics. A writer (one at a time,
//! behind a mutex taken once per request boundary) makes the sequence odd, stores, and makes it
//! even again; a reader retries in the rare case a writer ran while it read.
//!
//! The GPU-time split (`crate::cost::Ledger`) keeps its own integrals: it changes at a request's
//! first token too, and its reads are rare, so it takes a lock where this takes none.

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The time integral of the number of requests in flight.
#[derive(Debug)]
pub struct Concurrency {
    origin: Instant,
    /// Writers take turns here; readers never do.
    writer: Mutex<()>,
    /// Odd while a writer is changing the three fields below.
    seq: AtomicU64,
    /// Nanoseconds from `origin` to the instant the integral runs to.
    last_ns: AtomicU64,
    in_flight: AtomicU64,
    /// Sum of in_flight x seconds since `origin`, up to `last_ns` (an `f64`'s bits).
    integral: AtomicU64,
}

impl Default for Concurrency {
    fn default() -> Self {
        Concurrency {
            origin: Instant::now(),
            writer: Mutex::new(()),
            seq: AtomicU64::new(0),
            last_ns: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            integral: AtomicU64::new(0f64.to_bits()),
        }
    }
}

/// The concurrency tracker's state at one instant.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot {
    /// The instant the integral runs to: the time asked for, or a later one when another
    /// request had already moved the tracker past it (the clock is read before the tracker).
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

/// One consistent reading of the tracker's fields.
#[derive(Clone, Copy)]
struct State {
    last_ns: u64,
    in_flight: u64,
    integral: f64,
}

impl State {
    /// The state carried forward to `now_ns` (or kept at `last_ns` when that is later).
    fn at(self, now_ns: u64) -> State {
        let at = now_ns.max(self.last_ns);
        let secs = (at - self.last_ns) as f64 / 1e9;
        State {
            last_ns: at,
            in_flight: self.in_flight,
            integral: self.integral + self.in_flight as f64 * secs,
        }
    }
}

impl Concurrency {
    fn ns(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX)
    }

    fn snapshot_of(&self, s: State) -> Snapshot {
        Snapshot {
            at: self.origin + Duration::from_nanos(s.last_ns),
            integral: s.integral,
            in_flight: s.in_flight,
        }
    }

    /// A consistent reading, without a lock.
    fn read(&self) -> State {
        loop {
            let seq = self.seq.load(Ordering::Acquire);
            if seq & 1 == 0 {
                let s = State {
                    last_ns: self.last_ns.load(Ordering::Relaxed),
                    in_flight: self.in_flight.load(Ordering::Relaxed),
                    integral: f64::from_bits(self.integral.load(Ordering::Relaxed)),
                };
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == seq {
                    return s;
                }
            }
            std::hint::spin_loop();
        }
    }

    /// Moves the tracker to `now` and changes the number in flight by `delta`.
    pub fn update(&self, now: Instant, delta: i64) -> Snapshot {
        let _turn = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let s = State {
            in_flight: self
                .in_flight
                .load(Ordering::Relaxed)
                .saturating_add_signed(delta),
            ..self.read().at(self.ns(now))
        };
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        self.last_ns.store(s.last_ns, Ordering::Relaxed);
        self.in_flight.store(s.in_flight, Ordering::Relaxed);
        self.integral.store(s.integral.to_bits(), Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
        self.snapshot_of(s)
    }

    /// The tracker at `now` (or just after, see [`Snapshot::at`]). Takes no lock and writes
    /// nothing: this is what every token-bearing event calls.
    pub fn snapshot(&self, now: Instant) -> Snapshot {
        self.snapshot_of(self.read().at(self.ns(now)))
    }

    /// Requests in flight right now.
    pub fn current(&self) -> u64 {
        self.read().in_flight
    }

    /// Seconds since this tracker was created (for rates over its whole life).
    pub fn age(&self, now: Instant) -> f64 {
        now.saturating_duration_since(self.origin).as_secs_f64()
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

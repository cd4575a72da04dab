//! The in-flight cap (`--max-in-flight`): how many requests are being proxied at once, and
//! whether the proxy is overloaded (what `/readyz` reports).
//!
//! A [`Permit`] is one place under the cap. The request path takes one when a request arrives
//! ([`crate::proxy::admission`]) and keeps it in the response body, so a stream counts for as
//! long as it streams; dropping the permit gives the place back, however the request ends.
//!
//! Overload has hysteresis: the limiter turns overloaded when the count reaches the cap (the
//! next request would be shed) and ready again only once the count is down to the low-water
//! mark ([`low_water`], 90% of the cap), so a pod at its limit does not flap in and out of a
//! Service's endpoints with every request that ends.
//!
//! **Invariant:** the count never exceeds the cap, every permit is given back exactly once (on
//! drop), and the count and the overloaded flag change together, in one atomic word, so the
//! flag can never be left set by a race once the count is below the mark.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The overloaded flag's bit in [`Limiter`]'s state word; the bits below it are the count.
const OVERLOADED: u64 = 1 << 63;

/// The low-water mark of a cap: overloaded turns back to ready at or below it.
///
/// 90% of the cap, rounded down (always below the cap): a tenth of the cap must end before
/// new traffic is invited back, enough for the endpoints to settle between two readiness
/// probes (10 s apart by default) instead of following every single request.
pub fn low_water(cap: usize) -> usize {
    cap.saturating_mul(9) / 10
}

/// Counts the requests in flight against a cap.
#[derive(Debug)]
pub struct Limiter {
    cap: u64,
    low_water: u64,
    /// The count in the low bits, [`OVERLOADED`] on top.
    state: AtomicU64,
}

impl Limiter {
    /// A limiter for at most `cap` requests at once (`cap` is at least 1; config checks it).
    pub fn new(cap: usize) -> Self {
        let cap = cap.clamp(1, (OVERLOADED - 1) as usize);
        Limiter {
            cap: cap as u64,
            low_water: low_water(cap) as u64,
            state: AtomicU64::new(0),
        }
    }

    /// The cap.
    pub fn cap(&self) -> usize {
        self.cap as usize
    }

    /// Requests holding a permit now.
    pub fn in_flight(&self) -> usize {
        (self.state.load(Ordering::Acquire) & !OVERLOADED) as usize
    }

    /// Whether new traffic should go elsewhere: the cap was reached and the count has not yet
    /// fallen to the low-water mark.
    pub fn is_overloaded(&self) -> bool {
        self.state.load(Ordering::Acquire) & OVERLOADED != 0
    }

    /// A place under the cap, or `None` at the cap (the request is to be shed).
    pub fn try_acquire(self: &Arc<Self>) -> Option<Permit> {
        let mut admitted = false;
        // Refused or not, the word is updated: a refusal marks the limiter overloaded.
        let _ = self
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                let count = s & !OVERLOADED;
                admitted = count < self.cap;
                if !admitted {
                    return Some(s | OVERLOADED);
                }
                let count = count + 1;
                let flag = if count == self.cap {
                    OVERLOADED
                } else {
                    s & OVERLOADED
                };
                Some(count | flag)
            });
        admitted.then(|| Permit(Arc::clone(self)))
    }

    fn release(&self) {
        let _ = self
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                let count = (s & !OVERLOADED).saturating_sub(1);
                let flag = if count <= self.low_water {
                    0
                } else {
                    s & OVERLOADED
                };
                Some(count | flag)
            });
    }
}

/// One place under the cap, given back when dropped.
#[derive(Debug)]
pub struct Permit(Arc<Limiter>);

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_admits_that_many_and_each_drop_gives_one_back() {
        let l = Arc::new(Limiter::new(3));
        let permits: Vec<_> = (0..3)
            .map(|_| l.try_acquire().expect("under the cap"))
            .collect();
        assert_eq!(l.in_flight(), 3);
        assert!(l.try_acquire().is_none());
        assert!(l.try_acquire().is_none());
        assert_eq!(l.in_flight(), 3, "a refusal takes no place");
        drop(permits);
        assert_eq!(l.in_flight(), 0);
        assert!(l.try_acquire().is_some());
    }

    #[test]
    fn overloaded_at_the_cap_and_ready_again_at_the_low_water_mark() {
        let l = Arc::new(Limiter::new(10));
        assert_eq!(low_water(10), 9);
        let mut permits: Vec<_> = (0..9).map(|_| l.try_acquire().expect("admitted")).collect();
        assert!(!l.is_overloaded(), "below the cap, never shed: ready");
        permits.push(l.try_acquire().expect("the tenth"));
        assert!(l.is_overloaded(), "at the cap the next one is shed");
        assert!(l.try_acquire().is_none());
        permits.pop();
        assert_eq!(l.in_flight(), 9);
        assert!(!l.is_overloaded(), "down to the mark: ready");
        // Up again to the cap, then a refusal: overloaded until the mark, not the cap minus one.
        let l = Arc::new(Limiter::new(100));
        let mut permits: Vec<_> = (0..100)
            .map(|_| l.try_acquire().expect("admitted"))
            .collect();
        assert!(l.try_acquire().is_none());
        for _ in 0..10 {
            assert!(l.is_overloaded(), "{} in flight", l.in_flight());
            permits.pop();
        }
        assert_eq!(l.in_flight(), 90);
        assert!(!l.is_overloaded());
        // Between the mark and the cap, a limiter that did not reach the cap is ready.
        permits.push(l.try_acquire().expect("admitted"));
        assert!(!l.is_overloaded());
    }

    #[test]
    fn a_cap_of_one_is_ready_only_when_idle() {
        let l = Arc::new(Limiter::new(1));
        assert_eq!(low_water(1), 0);
        let p = l.try_acquire().expect("admitted");
        assert!(l.is_overloaded());
        drop(p);
        assert!(!l.is_overloaded());
    }

    #[test]
    fn threads_racing_never_exceed_the_cap_and_leave_it_empty() {
        let l = Arc::new(Limiter::new(8));
        let peak = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (l, peak) = (Arc::clone(&l), Arc::clone(&peak));
                std::thread::spawn(move || {
                    let mut held = Vec::new();
                    for i in 0..20_000 {
                        if let Some(p) = l.try_acquire() {
                            held.push(p);
                        }
                        peak.fetch_max(l.in_flight() as u64, Ordering::Relaxed);
                        if i % 3 == 0 {
                            held.clear();
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        assert!(peak.load(Ordering::Relaxed) <= 8);
        assert_eq!(l.in_flight(), 0);
        assert!(!l.is_overloaded(), "empty is ready");
    }
}

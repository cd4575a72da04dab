//! The ends of the engine's steps, as the proxy sees them: where a request's own step began.
//!
//! Every token-bearing event of every stream is the end of an engine step. A step's tokens reach
//! the proxy together, over a millisecond or so, and the next step's a whole step later; so the
//! sightings fall in clusters, one per step, and the first sighting of a cluster is when the
//! proxy saw that step end.
//!
//! The prefill fit ([`super::prefill`]) needs where a request's own step began. A request that
//! arrives while the engine computes a step waits for the rest of it, and that remainder is not
//! prefill. On open-loop arrivals it is spread over the whole step and a low quantile of the
//! waits leaves it out; a closed loop's next request arrives as long after the running step
//! began as its client took to send again, the same every round, and no quantile removes it (it
//! read the prefill 2-6% high on 1,500-token prompts, and the GPU-time split moved that from the
//! answers beside them to the long prompts). So each request takes, at its first token, the
//! step end seen between its arrival and its first token's own, where there was exactly one:
//! its own step began there, and the time from it to the first token is that step and nothing
//! else (no remainder, no queue). Both ends are sightings of the engine's steps, so the hop
//! between the proxy and the engine, which the arrival does not share, comes off too.
//!
//! A ring of the last [`RING`] clusters, lock-free: a sighting is an atomic maximum and, once a
//! step, a store; a first token reads the ring back from the newest to its arrival, a few slots.
//! A request whose wait outlasted the ring gets no step end, and the fit takes its wait from its
//! arrival.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Clusters (steps) remembered: 256 steps, seconds of a busy engine's steps (10-40 ms each), the
/// longest a first token is looked back for. 2 KiB.
pub const RING: usize = 256;

/// Sightings this close (ns) to the latest are the same step's until the model has fitted a
/// step: 1 ms, as [`super::prefill::group_tolerance`] takes at least.
const FIRST_TOLERANCE_NS: u64 = 1_000_000;

/// The ring of step ends. See the module documentation.
pub struct StepEnds {
    origin: Instant,
    /// The latest sighting, ns since `origin`.
    latest: AtomicU64,
    /// The first sighting of each of the last [`RING`] clusters, ns since `origin` plus one
    /// (0: never written).
    ring: Box<[AtomicU64]>,
    /// Clusters seen, the next slot's index.
    count: AtomicU64,
    /// Sightings within this many ns of the latest belong to its cluster.
    tolerance_ns: AtomicU64,
}

impl StepEnds {
    pub fn new(origin: Instant) -> Self {
        StepEnds {
            origin,
            latest: AtomicU64::new(0),
            ring: (0..RING).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            tolerance_ns: AtomicU64::new(FIRST_TOLERANCE_NS),
        }
    }

    /// How close sightings of one step end come: `tolerance`, from the fitted step.
    pub fn set_tolerance(&self, tolerance: Duration) {
        let ns = u64::try_from(tolerance.as_nanos()).unwrap_or(u64::MAX);
        self.tolerance_ns.store(ns.max(1), Ordering::Relaxed);
    }

    fn ns(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX - 1)
    }

    /// A token-bearing event passed at `at`: a step end was seen.
    pub fn sighted(&self, at: Instant) {
        let t = self.ns(at);
        let before = self.latest.fetch_max(t, Ordering::AcqRel);
        let tolerance = self.tolerance_ns.load(Ordering::Relaxed);
        // The first sighting after a quiet gap opens a cluster. (Two threads that see a new
        // step at once: the one that wins the maximum opens it; a cluster's start is then late
        // by the time between them, microseconds.)
        if t > before.saturating_add(tolerance) || before == 0 {
            let slot = self.count.fetch_add(1, Ordering::AcqRel) as usize % RING;
            self.ring[slot].store(t + 1, Ordering::Release);
        }
    }

    /// For a request that arrived at `arrived` and whose first token was just seen at `now`
    /// (after [`StepEnds::sighted`] for it): the step end seen between its arrival and its
    /// first token's own step, where there was exactly one: the end of the step that was
    /// running when it arrived, its own step beginning there. `None` where there was none (the
    /// engine was idle), more than one (it queued, or its prompt was prefilled in chunks over
    /// several steps: where its own step began is then unknown), or the ring no longer reaches
    /// back to its arrival.
    pub fn running_step_end(&self, arrived: Instant, now: Instant) -> Option<Instant> {
        let (after, now) = (self.ns(arrived), self.ns(now));
        let count = self.count.load(Ordering::Acquire);
        let (mut own, mut between) = (None, None);
        // Newest first (the ring is written in the order steps were seen), usually a few
        // slots: back to the first step end at or before the arrival.
        for back in 1..=count.min(RING as u64) {
            let v = self.ring[((count - back) % RING as u64) as usize].load(Ordering::Acquire);
            let Some(t) = v.checked_sub(1) else {
                continue;
            };
            if t <= after {
                return own.and(between).map(|t| self.at(t));
            }
            if own.is_none() {
                // Its first token's own step: the latest that began by `now`.
                own = (t <= now).then_some(t);
            } else if between.replace(t).is_some() {
                return None;
            }
        }
        // Every step end since the start is in the ring, and all came after the arrival; or
        // the ring has gone round since it, and an earlier step end may be lost.
        match count <= RING as u64 {
            true => own.and(between).map(|t| self.at(t)),
            false => None,
        }
    }

    fn at(&self, ns: u64) -> Instant {
        self.origin + Duration::from_nanos(ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(t0: Instant, n: f64) -> Instant {
        t0 + Duration::from_secs_f64(n / 1000.0)
    }

    #[test]
    fn the_step_a_request_waited_for_is_the_one_step_end_before_its_own() {
        let t0 = Instant::now();
        let ends = StepEnds::new(t0);
        // Steps ending every 10 ms, each seen by three streams over 0.4 ms.
        for step in 1..=5 {
            for s in 0..3 {
                ends.sighted(ms(t0, 10.0 * f64::from(step) + 0.2 * f64::from(s)));
            }
        }
        // Arrived at 33 ms: the step running then ended at 40 ms, and its first token is seen at
        // 50.3 ms, among the fifth step's sightings (not its own step's start).
        assert_eq!(
            ends.running_step_end(ms(t0, 33.0), ms(t0, 50.3)),
            Some(ms(t0, 40.0))
        );
        // Arrived at 23 ms: two steps ended before its own (it queued, or its prompt took two
        // steps): where its step began is not known.
        assert_eq!(ends.running_step_end(ms(t0, 23.0), ms(t0, 50.3)), None);
        // Arrived after the last step end before its own: no step ran beside it.
        assert_eq!(ends.running_step_end(ms(t0, 45.0), ms(t0, 50.3)), None);
    }

    #[test]
    fn an_idle_engine_has_no_step_end_before_the_first_token() {
        let t0 = Instant::now();
        let ends = StepEnds::new(t0);
        ends.sighted(ms(t0, 5.0));
        // Arrived at 100 ms on an idle engine; its first token at 130 ms opens a cluster.
        ends.sighted(ms(t0, 130.0));
        assert_eq!(ends.running_step_end(ms(t0, 100.0), ms(t0, 130.0)), None);
    }

    #[test]
    fn a_wait_longer_than_the_ring_reaches_has_no_step_end() {
        let t0 = Instant::now();
        let ends = StepEnds::new(t0);
        for step in 1..=(RING as u32 + 10) {
            ends.sighted(ms(t0, 10.0 * f64::from(step)));
        }
        let last = ms(t0, 10.0 * (RING as f64 + 10.0));
        // Arrived before the oldest step end the ring holds, a step before the last.
        let oldest = ms(t0, 10.0 * 11.0);
        ends.sighted(last);
        assert_eq!(
            ends.running_step_end(oldest - Duration::from_millis(1), last),
            None
        );
        // One that arrived within the ring's reach has its step end.
        let arrived = ms(t0, 10.0 * (RING as f64 + 8.0) + 1.0);
        assert_eq!(
            ends.running_step_end(arrived, last),
            Some(ms(t0, 10.0 * (RING as f64 + 9.0)))
        );
    }

    #[test]
    fn the_tolerance_follows_the_fitted_step() {
        let t0 = Instant::now();
        let ends = StepEnds::new(t0);
        ends.set_tolerance(Duration::from_millis(4));
        // One step's sightings spread over 3 ms: one cluster.
        for s in 0..4 {
            ends.sighted(ms(t0, 10.0 + f64::from(s)));
        }
        ends.sighted(ms(t0, 30.0));
        assert_eq!(
            ends.running_step_end(ms(t0, 1.0), ms(t0, 30.0)),
            Some(ms(t0, 10.0))
        );
        // At the first 1 ms, the same sightings were four steps.
        let ends = StepEnds::new(t0);
        for s in 0..4 {
            ends.sighted(ms(t0, 10.0 + 1.5 * f64::from(s)));
        }
        ends.sighted(ms(t0, 30.0));
        assert_eq!(ends.running_step_end(ms(t0, 1.0), ms(t0, 30.0)), None);
        assert_eq!(ends.running_step_end(ms(t0, 10.5), ms(t0, 30.0)), None);
    }
}

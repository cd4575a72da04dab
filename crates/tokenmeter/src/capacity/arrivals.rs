//! How the window's requests arrived: a closed loop whose clients move in step, a closed loop
//! whose clients come and go on their own, or arrivals open to the world.
//!
//! How many requests an engine can hold at a TTFT target depends on how they arrive as much as
//! on the engine: `n` clients that send together wait for `n` prefills, the same `n` spread out
//! wait for one. A model that assumed one shape for every window answered for traffic nobody
//! sent: replaying clients that all start at once put a 1 s TTFT bound at 36 streams on Poisson
//! arrivals that met it at 53. So the limits replay the shape the window had ([`Shape`]), read
//! from the requests themselves:
//!
//! - **closed or open**: a closed-loop client sends its next request the moment its last one
//!   ends, so nearly every arrival follows some request's end within a turnaround; independent
//!   arrivals follow an end that closely only by chance, and the turnaround is set so that
//!   chance gives 30% ([`turnaround`], [`CLOSED_SHARE`]);
//! - **in step or not**: clients that move in step are admitted into one step together (their
//!   first tokens come together, [`super::prefill::steps`]); clients on their own mostly are not
//!   ([`IN_STEP_SHARE`]).

use std::time::Instant;

use super::prefill;
use super::workload::Request;

/// How far above chance the share of arrivals that follow another request's end within a
/// turnaround must be for the window to be a closed loop: halfway from what independent
/// arrivals would give to all of them. A closed loop gives nearly all (all but each client's
/// first, and the turnarounds a busy client stretches past the window).
pub const CLOSED_SHARE: f64 = 0.5;

/// The share of arrivals that independent arrivals put within a turnaround of some end, which
/// sets the turnaround's length: long enough for a client on a busy machine (a CPU engine
/// beside it), short enough that chance alone does not fill it.
pub const CHANCE_SHARE: f64 = 0.3;

/// The share of a closed loop's requests admitted into a step with others for its clients to
/// be in step: all of them when they move together, a few by chance when they do not.
pub const IN_STEP_SHARE: f64 = 0.5;

/// Requests needed before the shape is read; fewer say nothing, and the model takes the
/// clients as in step (the worst case, as before the shape was read).
pub const MIN_REQUESTS: usize = 20;

/// How the window's requests arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// A closed loop whose clients send together: a load test's levels, a batch job's workers.
    InStep,
    /// A closed loop whose clients send on their own: users, agents.
    Joining,
    /// Arrivals that do not wait for answers: a service open to the world.
    Open,
}

impl Shape {
    pub fn as_str(self) -> &'static str {
        match self {
            Shape::InStep => "closed_in_step",
            Shape::Joining => "closed",
            Shape::Open => "open",
        }
    }
}

/// The turnaround window, seconds, for ends that come `per_second` a second: the one within
/// which independent arrivals follow an end in [`CHANCE_SHARE`] of cases
/// (`1 - exp(-rate x window)`), between 5 ms and 200 ms, and the share chance gives at that
/// length. At 100 ends a second, 3.6 ms; at 6, 59 ms; at 1, 200 ms (chance 0.18).
pub fn turnaround(per_second: f64) -> (f64, f64) {
    let rate = if per_second.is_finite() && per_second > 0.0 {
        per_second
    } else {
        1.0
    };
    let window = (-(1.0 - CHANCE_SHARE).ln() / rate).clamp(0.005, 0.200);
    (window, 1.0 - (-rate * window).exp())
}

/// The shape of `recent`'s arrivals (oldest first or in any order) on an engine whose
/// one-sequence step is `one` seconds; `None` with fewer than [`MIN_REQUESTS`].
pub fn shape(recent: &[Request], one: f64) -> Option<Shape> {
    if recent.len() < MIN_REQUESTS {
        return None;
    }
    let mut ends: Vec<Instant> = recent.iter().map(|r| r.at).collect();
    ends.sort();
    let first_end = ends[0];
    let span = ends[ends.len() - 1]
        .saturating_duration_since(first_end)
        .as_secs_f64();
    let (window, chance) = turnaround((ends.len() - 1) as f64 / span.max(1e-3));
    // Arrivals before any end of the window could not have followed one: left out.
    let judged: Vec<&Request> = recent.iter().filter(|r| r.arrival >= first_end).collect();
    if judged.len() < MIN_REQUESTS / 2 {
        return Some(Shape::InStep);
    }
    let following = judged
        .iter()
        .filter(|r| {
            // The last end at or before the arrival.
            let i = ends.partition_point(|e| *e <= r.arrival);
            i > 0
                && r.arrival
                    .saturating_duration_since(ends[i - 1])
                    .as_secs_f64()
                    <= window
        })
        .count();
    let needed = chance + CLOSED_SHARE * (1.0 - chance);
    if (following as f64) < needed * judged.len() as f64 {
        return Some(Shape::Open);
    }
    let steps = prefill::steps(recent, prefill::group_tolerance(one));
    let together: usize = steps.iter().filter(|g| g.len() > 1).map(Vec::len).sum();
    let admitted: usize = steps.iter().map(Vec::len).sum();
    Some(if together as f64 >= IN_STEP_SHARE * admitted as f64 {
        Shape::InStep
    } else {
        Shape::Joining
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn request(arrival: Instant, ttft: f64, duration: f64) -> Request {
        Request {
            at: arrival + Duration::from_secs_f64(duration),
            arrival,
            prompt: 256,
            cached: 0,
            output: 256,
            ttft: Some(ttft),
            stated_prefill: None,
            stated_queue: None,
            step_end: None,
            tps: None,
            batch: None,
        }
    }

    const STEP: f64 = 0.0162;

    #[test]
    fn clients_in_step_clients_on_their_own_and_open_arrivals_are_told_apart() {
        let t0 = Instant::now();
        // Eight clients in step: every round they all end together, send 1 ms later and are
        // admitted into one step.
        let mut in_step = Vec::new();
        for round in 0..10u64 {
            let start = t0 + Duration::from_secs(5 * round);
            for c in 0..8u64 {
                let arrival = start + Duration::from_micros(100 * c);
                in_step.push(request(arrival, 0.05, 4.999));
            }
        }
        assert_eq!(shape(&in_step, STEP), Some(Shape::InStep));
        // Eight clients on their own: each sends 2 ms after its last answer, the clients half
        // a second apart.
        let mut joining = Vec::new();
        for c in 0..8u64 {
            let mut at = t0 + Duration::from_millis(500 * c);
            for _ in 0..10 {
                joining.push(request(at, 0.05, 4.0));
                at += Duration::from_millis(4002);
            }
        }
        assert_eq!(shape(&joining, STEP), Some(Shape::Joining));
        // Poisson arrivals, 170 ms apart on average, whatever the answers: open.
        let mut rng = crate::capacity::fit::tests::Rng::new(3);
        let mut at = t0;
        let open: Vec<Request> = (0..200)
            .map(|_| {
                at += Duration::from_secs_f64(-0.170 * rng.uniform().max(1e-9).ln());
                request(at, 0.05, 3.0 + 2.0 * rng.uniform())
            })
            .collect();
        assert_eq!(shape(&open, STEP), Some(Shape::Open));
        // Four clients of a CPU engine on a busy machine: 8 s answers, and 40-120 ms between an
        // answer's end and the next request as the proxy sees them. Still a closed loop.
        let mut busy = Vec::new();
        for c in 0..4u64 {
            let mut at = t0 + Duration::from_millis(1500 * c);
            for k in 0..10u64 {
                busy.push(request(at, 1.5, 8.0));
                at += Duration::from_millis(8000 + 40 + (k * 29 + c * 17) % 80);
            }
        }
        assert!(matches!(
            shape(&busy, STEP),
            Some(Shape::Joining | Shape::InStep)
        ));
        // Bursts of 20 every 10 s, each answered within 5 s: open too (no arrival waits for
        // an answer), though they arrive together.
        let mut bursts = Vec::new();
        for b in 0..5u64 {
            for i in 0..20u64 {
                let arrival = t0 + Duration::from_secs(10 * b) + Duration::from_micros(200 * i);
                bursts.push(request(arrival, 0.3, 5.0));
            }
        }
        assert_eq!(shape(&bursts, STEP), Some(Shape::Open));
        assert_eq!(shape(&open[..MIN_REQUESTS - 1], STEP), None);
    }
}

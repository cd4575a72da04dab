//! The first-token end of the capacity answer: how many requests in flight an engine can hold,
//! and how many arrivals a second, before a class's TTFT objective breaks.
//!
//! Both come from replaying the engine ([`super::replay`]) with the fitted decode and prefill
//! costs over the live mix, arriving as the window's requests arrived ([`Shape`]):
//!
//! - a closed loop (in step, or clients on their own): the concurrency limit is the largest
//!   number of clients whose replayed TTFTs meet the class's target at its objective;
//! - open arrivals: the concurrency a Poisson stream holds (Little's law, the replay's
//!   [`Replayed::mean_in_flight`]) at the highest rate whose TTFTs meet the target, and the same
//!   for the speed floor: the steady state such traffic settles in, never the transient of
//!   clients that all start at once, which is not what open traffic does.
//!
//! The rate limit is the highest Poisson arrival rate whose replayed requests meet every target
//! the class has (TTFT and decode speed), whatever the shape. Replays of one refit are memoised
//! by their load, so classes share them.

use std::collections::HashMap;

use super::arrivals::Shape;
use super::replay::{self, Engine, Job, Load, Replayed};
use super::steps::MAX_CONCURRENCY;

/// Bisection steps for the rate: the interval shrinks 2^-12 times, far below the replay's own
/// sampling error.
const RATE_STEPS: u32 = 12;

/// The TTFT quantiles the curve reports.
pub const QUANTILES: [f64; 3] = [0.5, 0.9, 0.99];

/// The predicted TTFT at one concurrency.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TtftPoint {
    pub concurrency: u32,
    /// At [`QUANTILES`], seconds.
    pub quantiles: [f64; 3],
}

/// One refit's replays.
pub struct Replays<'a> {
    engine: Engine,
    jobs: &'a [Job],
    shape: Shape,
    closed: HashMap<u32, Option<Replayed>>,
}

impl<'a> Replays<'a> {
    /// Replays whose clients move in step (the worst case of a closed loop, and the shape a
    /// window too young to read is taken as).
    pub fn new(engine: Engine, jobs: &'a [Job]) -> Self {
        Self::shaped(engine, jobs, Shape::InStep)
    }

    /// Replays of traffic that arrives as `shape` says.
    pub fn shaped(engine: Engine, jobs: &'a [Job], shape: Shape) -> Self {
        Replays {
            engine,
            jobs,
            shape,
            closed: HashMap::new(),
        }
    }

    /// The shape the replays take.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// The closed loop of `n` clients in the window's shape (memoised); open traffic's
    /// concurrencies are replayed as clients on their own, its steady state at `n`.
    fn closed(&mut self, n: u32) -> Option<&Replayed> {
        let (engine, jobs) = (self.engine, self.jobs);
        let load = match self.shape {
            Shape::InStep => Load::Closed(n),
            Shape::Joining | Shape::Open => Load::Joining(n),
        };
        self.closed
            .entry(n)
            .or_insert_with(|| replay::run(&engine, jobs, load))
            .as_ref()
    }

    /// The replay with `n` closed-loop clients (memoised).
    pub fn at(&mut self, n: u32) -> Option<&Replayed> {
        self.closed(n)
    }

    /// Output tokens/s per engine with `n` clients.
    pub fn output_tps(&mut self, n: u32) -> Option<f64> {
        self.closed(n).map(|r| r.output_tps)
    }

    /// The predicted TTFT at each of `concurrencies` (the tokens/s curve's, `plan::CURVE`).
    pub fn curve(&mut self, concurrencies: &[u32]) -> Vec<TtftPoint> {
        concurrencies
            .iter()
            .filter_map(|&n| {
                let r = self.closed(n)?;
                let q = |i: usize| r.ttft_quantile(QUANTILES[i]);
                Some(TtftPoint {
                    concurrency: n,
                    quantiles: [q(0)?, q(1)?, q(2)?],
                })
            })
            .collect()
    }

    /// The largest number of requests in flight whose TTFTs meet `ttft` seconds in `objective`
    /// of requests, in the window's shape; 0 when one alone does not.
    pub fn concurrency_limit(&mut self, ttft: f64, objective: f64) -> Option<u32> {
        if self.shape == Shape::Open {
            return self.open_concurrency(Some(ttft), None, objective);
        }
        self.clients_limit(ttft, objective)
    }

    /// For open traffic, the largest number of requests in flight whose decode speed meets
    /// `tps` in `objective` of requests: the Poisson stream's steady state. `None` for a closed
    /// loop, whose speed bound is the decode line's.
    pub fn speed_limit(&self, tps: f64, objective: f64) -> Option<u32> {
        if self.shape != Shape::Open {
            return None;
        }
        self.open_concurrency(None, Some(tps), objective)
    }

    /// The mean requests in flight, rounded down, of Poisson arrivals at the highest rate that
    /// meets the targets.
    fn open_concurrency(&self, ttft: Option<f64>, tps: Option<f64>, objective: f64) -> Option<u32> {
        let rate = self.rate_limit(ttft, tps, objective)?;
        if rate <= 0.0 {
            return Some(0);
        }
        let r = replay::run(&self.engine, self.jobs, Load::Open(rate))?;
        Some((r.mean_in_flight.floor().max(1.0) as u32).min(MAX_CONCURRENCY as u32))
    }

    /// The largest number of closed-loop clients whose TTFTs meet `ttft` seconds in
    /// `objective` of requests; 0 when one client alone does not.
    fn clients_limit(&mut self, ttft: f64, objective: f64) -> Option<u32> {
        let meets = |s: &mut Self, n: u32| -> Option<bool> {
            Some(s.closed(n)?.share_meeting(Some(ttft), None) >= objective)
        };
        if !meets(self, 1)? {
            return Some(0);
        }
        let top = MAX_CONCURRENCY as u32;
        if meets(self, top)? {
            return Some(top);
        }
        // meets(lo) and not meets(hi): TTFT grows with the clients, so the edge is between.
        let (mut lo, mut hi) = (1u32, top);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if meets(self, mid)? {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Some(lo)
    }

    /// The highest arrival rate per second whose requests meet `ttft` seconds and `tps`
    /// tokens/s (each where given) in `objective` of requests; 0 when even a trickle does not.
    pub fn rate_limit(&self, ttft: Option<f64>, tps: Option<f64>, objective: f64) -> Option<f64> {
        if ttft.is_none() && tps.is_none() {
            return None;
        }
        let meets = |rate: f64| -> Option<bool> {
            let r = replay::run(&self.engine, self.jobs, Load::Open(rate))?;
            Some(r.share_meeting(ttft, tps) >= objective)
        };
        // The rate one request at a time would take, the engine's time per request alone.
        let one = replay::run(&self.engine, self.jobs, Load::Closed(1))?;
        let alone = one.output_tps / mean_output(self.jobs);
        let mut lo = alone / 64.0;
        if !meets(lo)? {
            return Some(0.0);
        }
        let mut hi = lo * 2.0;
        let mut doublings = 0;
        while meets(hi)? {
            lo = hi;
            hi *= 2.0;
            doublings += 1;
            if doublings > 16 {
                return Some(lo);
            }
        }
        for _ in 0..RATE_STEPS {
            let mid = (lo + hi) / 2.0;
            if meets(mid)? {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Some(lo)
    }
}

fn mean_output(jobs: &[Job]) -> f64 {
    (jobs.iter().map(|j| f64::from(j.output.max(1))).sum::<f64>() / jobs.len().max(1) as f64)
        .max(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::replay::LONG;

    #[test]
    fn long_prompts_bind_at_the_first_token() {
        let jobs = [Job {
            uncached: 2000,
            output: 100,
        }];
        let mut r = Replays::new(LONG, &jobs);
        // In step, n clients wait n x 400 ms: four meet 2 s at 0.9, five do not.
        assert_eq!(r.concurrency_limit(2.0, 0.9), Some(4));
        assert_eq!(r.concurrency_limit(0.3, 0.9), Some(0));
        assert_eq!(r.concurrency_limit(1000.0, 0.9), Some(256));
        let curve = r.curve(&crate::capacity::plan::CURVE);
        assert_eq!(curve.len(), 9);
        assert!((curve[0].quantiles[1] - 0.4102).abs() < 1e-6, "{curve:?}");
        assert!(curve
            .windows(2)
            .all(|w| w[0].quantiles[1] < w[1].quantiles[1]));
        // One request needs about 1.4 s of the engine alone; arrivals faster than the prefill
        // can take (2.5/s) queue without end. The rate that keeps 90% under 2 s is between.
        let rate = r.rate_limit(Some(2.0), None, 0.9).expect("a rate");
        assert!((0.7..2.5).contains(&rate), "{rate}");
        assert_eq!(r.rate_limit(None, None, 0.9), None);
    }
}

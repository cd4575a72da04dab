//! The engine's prefill cost per uncached prompt token, from the first tokens of the window.
//!
//! Prefill is compute-bound: its cost grows with the prompt, less what the prefix cache serves.
//! A continuously batched engine admits every prompt that has arrived when a step starts into
//! that step, and every one of them gets its first token at the step's end. So a first token
//! waits for three things: the step that was running when its request arrived, any queue, and
//! then its own step, which costs a decode step at its batch `t(b)` plus the prefill of **every
//! prompt admitted with it**. Dividing TTFT by the request's own prompt, as if it were alone,
//! read 24 times the truth on 24 clients that arrive together (each first token carries the
//! other 23 prompts) and twice the truth on open-loop arrivals (the wait for the running step
//! read as prefill).
//!
//! So the requests are first grouped by the step that admitted them: first tokens that came
//! within a fraction of a step of each other ([`group_tolerance`]) came from one step. Each
//! group gives one estimate, `(wait - t(b)) / uncached prompt tokens of the whole group`, where
//! the wait is the engine's stated prefill time where its stream states one (vLLM's
//! `--enable-per-request-metrics`: the step from admission to first token, no queue in it), and
//! otherwise the time to the first token from where the group's step began, where the proxy
//! saw that: the end of the step that was running when its **last** member arrived, the one step
//! end seen between that arrival and the first token's own ([`super::step_ends`]). Such a wait
//! holds the group's step and nothing else (no remainder of the running step, no queue, no hop
//! to the engine: both ends are sightings of the engine's steps), and is as likely a little
//! short as a little long, so the cost is the median ([`PLACED_QUANTILE`]) of these groups'.
//!
//! Where fewer groups were placed than the fit needs, every group's wait runs from its last
//! member's arrival (plus its stated queue time, where only that is stated): the step cannot
//! have started before, so what is left over is the running step's remainder and queueing, which
//! only ever add, and the cost is a low quantile ([`QUANTILE`]) of the groups': it assumes that
//! one group in twenty arrived just as a step began. That holds for open-loop arrivals, not for
//! a closed loop: its next request arrives as long after the running step began as the client
//! took to send again, the same every round, so no quantile removes the remainder (it read the
//! cost 2-6% high on 1,500-token prompts beside long answers). A group has no step end placed
//! where the engine was idle when it arrived, where it queued or its prompt was prefilled in
//! chunks (more than one step end before its own), where its own step's sightings spread over
//! more than [`OWN_STEP`] of a step, and in front of several replicas.

use std::time::{Duration, Instant};

use super::workload::Request;

/// Groups whose uncached prompts add up to fewer tokens are left out: their prefill is lost in
/// the step and the network.
pub const MIN_UNCACHED: u32 = 32;

/// Estimates (groups) needed before the cost is believed.
pub const MIN_SAMPLES: usize = 8;

/// A step end seen less than this share of the group's own step before its first token is
/// that step's own end, seen over longer than the grouping tolerance, not the one before it:
/// the wait is then taken from the arrival.
pub const OWN_STEP: f64 = 0.5;

/// The quantile of the placed groups' estimates taken as the cost: their waits hold the step
/// and nothing else, read between two sightings whose lags differ either way, so the middle.
pub const PLACED_QUANTILE: f64 = 0.5;

/// The quantile of the estimates taken as the cost. Everything a group's wait holds beyond its
/// step only adds (the running step's remainder, queueing, the hop to the engine and back), so
/// the lower the better, as long as it is more than one group's: at 0.05, open-loop arrivals
/// (a remainder uniform over the step) read the cost high by 5% of a step over the group's
/// prompt, 9% of the simulator's defaults with 280-token prompts.
pub const QUANTILE: f64 = 0.05;

/// Where the waits came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillSource {
    /// The engine's stated prefill times (`--enable-per-request-metrics` and the like).
    Stated,
    /// The proxy's TTFT.
    Wire,
    /// No prompt in the window was long enough: prefill is taken as free.
    None,
}

impl PrefillSource {
    pub fn as_str(self) -> &'static str {
        match self {
            PrefillSource::Stated => "stated",
            PrefillSource::Wire => "wire",
            PrefillSource::None => "none",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefillFit {
    /// Seconds per uncached prompt token.
    pub per_token: f64,
    /// Groups (steps) the cost was read from.
    pub samples: usize,
    pub source: PrefillSource,
}

/// First tokens this close together (seconds) came from one step: a fraction of the shortest
/// step, `t(1)`, so that two steps (at least `t(1)` apart) are never joined, with room for the
/// proxy's own scheduling between reading one stream and the next (at least 1 ms, at most
/// 20 ms on engines whose steps are long).
pub fn group_tolerance(one: f64) -> f64 {
    (0.4 * one).clamp(0.001, 0.020)
}

/// The requests of `requests` that share a step, by their first tokens: ascending, each group
/// a list of indices. Requests without a first token are left out.
pub fn steps(requests: &[Request], tolerance: f64) -> Vec<Vec<usize>> {
    let mut firsts: Vec<(std::time::Instant, usize)> = requests
        .iter()
        .enumerate()
        .filter_map(|(i, r)| Some((r.first_token()?, i)))
        .collect();
    firsts.sort_by_key(|p| p.0);
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut last = None;
    for (at, i) in firsts {
        let joined = last.is_some_and(|l: std::time::Instant| {
            at.saturating_duration_since(l).as_secs_f64() <= tolerance
        });
        match groups.last_mut() {
            Some(g) if joined => g.push(i),
            _ => groups.push(vec![i]),
        }
        last = Some(at);
    }
    groups
}

/// The cost from `requests`, given what a decode step of `b` sequences costs alone
/// (`step(b)`, seconds); `None` while fewer than [`MIN_SAMPLES`] groups with long enough
/// prompts have been seen but some have.
pub fn fit(requests: &[Request], step: impl Fn(f64) -> f64) -> Option<PrefillFit> {
    fit_at_least(requests, step, MIN_SAMPLES)
}

/// [`fit`], believed from `min` groups: the GPU-time split takes a first reading from two, as
/// it must weigh prompts from the first seconds (a capacity answer waits for [`MIN_SAMPLES`]).
pub fn fit_at_least(
    requests: &[Request],
    step: impl Fn(f64) -> f64,
    min: usize,
) -> Option<PrefillFit> {
    let tolerance = group_tolerance(step(1.0));
    let long: Vec<Vec<usize>> = steps(requests, tolerance)
        .into_iter()
        .filter(|g| g.iter().map(|&i| requests[i].uncached()).sum::<u32>() >= MIN_UNCACHED)
        .collect();
    if long.is_empty() {
        return Some(PrefillFit {
            per_token: 0.0,
            samples: 0,
            source: PrefillSource::None,
        });
    }
    let members = long.iter().map(Vec::len).sum::<usize>();
    let stated = long
        .iter()
        .flatten()
        .filter(|&&i| requests[i].stated_prefill.is_some())
        .count();
    let source = if 2 * stated >= members {
        PrefillSource::Stated
    } else {
        PrefillSource::Wire
    };
    // Each group's estimate from the wait since its last member's arrival, and where the
    // proxy saw where its step began, from there.
    let estimates: Vec<(f64, Option<f64>)> = long
        .iter()
        .filter_map(|g| {
            let of = || g.iter().map(|&i| &requests[i]);
            let uncached = f64::from(of().map(Request::uncached).sum::<u32>());
            // The step's batch: the group's own size at least, and the requests in flight
            // beside them as the members saw it.
            let seen = of().filter_map(|r| r.batch).fold(0.0, f64::max);
            let own = step(seen.max(g.len() as f64));
            let per_token = |wait: f64| (wait - own).max(0.0) / uncached;
            if source == PrefillSource::Stated {
                let wait = of().filter_map(|r| r.stated_prefill).reduce(f64::min)?;
                return wait.is_finite().then(|| (per_token(wait), None));
            }
            let first = of().filter_map(Request::first_token).min()?;
            let (start, last) = of()
                .map(|r| {
                    let queued = r.stated_queue.filter(|q| q.is_finite() && *q > 0.0);
                    let queued = queued.and_then(|q| Duration::try_from_secs_f64(q).ok());
                    (r.arrival + queued.unwrap_or_default(), r)
                })
                .max_by_key(|(start, _)| *start)?;
            let since = |t: Instant| first.saturating_duration_since(t).as_secs_f64();
            // Its step began at the end of the step running when its last member arrived,
            // where the proxy saw that end: unless it is the group's own step's, seen spread.
            let placed = last
                .step_end
                .filter(|&e| e > start && since(e) >= OWN_STEP * own)
                .map(|e| per_token(since(e)));
            Some((per_token(since(start)), placed))
        })
        .collect();
    let placed: Vec<f64> = estimates.iter().filter_map(|e| e.1).collect();
    let (mut per_token, quantile) = if placed.len() >= min.max(1) {
        (placed, PLACED_QUANTILE)
    } else {
        (estimates.iter().map(|e| e.0).collect(), QUANTILE)
    };
    if per_token.len() < min.max(1) {
        return None;
    }
    per_token.sort_by(f64::total_cmp);
    let rank = ((quantile * per_token.len() as f64).ceil() as usize).clamp(1, per_token.len());
    Some(PrefillFit {
        per_token: per_token[rank - 1],
        samples: per_token.len(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    /// Request `i` of a test: arrivals 10 s apart, so no two share a step unless a test says.
    fn req(i: u32, prompt: u32, cached: u32, ttft: f64, stated: Option<f64>) -> Request {
        let arrival = Instant::now() + Duration::from_secs(10 * u64::from(i));
        Request {
            at: arrival + Duration::from_secs(5),
            arrival,
            prompt,
            cached,
            output: 10,
            ttft: Some(ttft),
            stated_prefill: stated,
            stated_queue: None,
            step_end: None,
            tps: None,
            batch: None,
        }
    }

    /// A step of 10 ms whatever the batch.
    fn flat(_: f64) -> f64 {
        0.010
    }

    #[test]
    fn a_stated_queue_comes_off_the_wire_wait() {
        // Every request queued 2 s at the engine, which says so; its prefill it does not state.
        let rs: Vec<Request> = (0..10)
            .map(|i| Request {
                stated_queue: Some(2.0),
                ..req(i, 1000, 0, 2.0 + 0.010 + 0.2, None)
            })
            .collect();
        let f = fit(&rs, flat).expect("a fit");
        assert_eq!(f.source, PrefillSource::Wire);
        assert!((f.per_token - 0.0002).abs() < 1e-9, "{f:?}");
    }

    #[test]
    fn the_cost_is_the_low_quantile_of_the_waits_less_a_step() {
        // 0.2 ms per token and a 10 ms step; nine of twenty requests queued behind others.
        let mut rs: Vec<Request> = (0..11)
            .map(|i| {
                req(
                    i,
                    2000 + 100 * i,
                    0,
                    0.010 + 0.0002 * f64::from(2000 + 100 * i),
                    None,
                )
            })
            .collect();
        rs.extend((0..9).map(|i| req(11 + i, 2000, 0, 0.41 + 0.4 * f64::from(i + 1), None)));
        let f = fit(&rs, flat).expect("a fit");
        assert_eq!((f.samples, f.source), (20, PrefillSource::Wire));
        assert!((f.per_token - 0.0002).abs() < 1e-9, "{f:?}");
    }

    #[test]
    fn stated_prefill_wins_and_cached_tokens_cost_nothing() {
        // Queued for a second each on the wire, but the engine states 0.25 s of prefill for
        // 1000 uncached tokens of 3000 (2000 served by the cache).
        let rs: Vec<Request> = (0..10)
            .map(|i| req(i, 3000, 2000, 1.25, Some(0.25)))
            .collect();
        let f = fit(&rs, flat).expect("a fit");
        assert_eq!(f.source, PrefillSource::Stated);
        assert!((f.per_token - 0.00024).abs() < 1e-9, "{f:?}");
    }

    #[test]
    fn short_prompts_leave_prefill_free_and_few_long_ones_wait() {
        let short: Vec<Request> = (0..50).map(|i| req(i, 20, 0, 0.02, None)).collect();
        let f = fit(&short, flat).expect("a fit");
        assert_eq!((f.per_token, f.source), (0.0, PrefillSource::None));
        let few: Vec<Request> = (0..3).map(|i| req(i, 500, 0, 0.2, None)).collect();
        assert_eq!(fit(&few, flat), None);
    }

    /// The engine of the simulator's defaults: 16 ms + 0.2 ms per sequence a step, 0.05 ms per
    /// prompt token.
    fn sim_step(b: f64) -> f64 {
        0.016 + 0.0002 * b
    }

    #[test]
    fn clients_that_arrive_together_share_one_step_and_its_prefill() {
        // 24 closed-loop clients in step with 280-token prompts: every round they all arrive
        // within a millisecond, the next step admits all 24 prompts (6,720 tokens, 336 ms) and
        // each first token comes at its end. Alone, each request would read 24 times the cost.
        let t0 = Instant::now();
        let mut rs = Vec::new();
        for round in 0..20u64 {
            let start = t0 + Duration::from_secs(6 * round);
            let step = sim_step(24.0) + 0.000_05 * 24.0 * 280.0;
            // The round began mid-step: its requests wait for the running step's remainder.
            let remainder = 0.001 * (round % 10) as f64;
            for c in 0..24u64 {
                let arrival = start + Duration::from_micros(40 * c);
                let first = start + Duration::from_secs_f64(0.001 + remainder + step);
                // The proxy reads the 24 streams' first tokens over a millisecond or so.
                let seen = first + Duration::from_micros(50 * c);
                rs.push(Request {
                    at: seen + Duration::from_secs(5),
                    arrival,
                    prompt: 280,
                    cached: 0,
                    output: 256,
                    ttft: Some(seen.duration_since(arrival).as_secs_f64()),
                    stated_prefill: None,
                    stated_queue: None,
                    step_end: None,
                    tps: None,
                    batch: Some(24.0),
                });
            }
        }
        assert_eq!(steps(&rs, group_tolerance(sim_step(1.0))).len(), 20);
        let f = fit(&rs, sim_step).expect("a fit");
        assert_eq!((f.samples, f.source), (20, PrefillSource::Wire));
        assert!((f.per_token / 0.000_05 - 1.0).abs() < 0.1, "{f:?}");
    }

    #[test]
    fn a_closed_loops_remainder_comes_off_from_the_step_end_seen() {
        // Beside long answers decoding in 10 ms steps, one client sends a 1,000-token prompt
        // (0.1 ms a token) 4 ms after its last answer's last token, every round: it waits the
        // 6 ms left of the running step, then its own (10 ms and its prefill). Every round
        // waits the same, so the low quantile of the waits from the arrival keeps 6 ms: 6% high.
        let t0 = Instant::now();
        let round = |i: u32, seen: Option<f64>| {
            let arrival = t0 + Duration::from_secs(u64::from(i));
            Request {
                arrival,
                at: arrival + Duration::from_millis(500),
                step_end: seen.map(|s| arrival + Duration::from_secs_f64(s)),
                ..req(0, 1000, 0, 0.006 + 0.010 + 0.1, None)
            }
        };
        let from_arrival: Vec<Request> = (0..20).map(|i| round(i, None)).collect();
        let f = fit(&from_arrival, flat).expect("a fit");
        assert!((f.per_token / 0.000_1 - 1.06).abs() < 1e-6, "{f:?}");
        // The running step's end, seen 6 ms after the arrival: the cost itself.
        let placed: Vec<Request> = (0..20).map(|i| round(i, Some(0.006))).collect();
        let f = fit(&placed, flat).expect("a fit");
        assert!((f.per_token / 0.000_1 - 1.0).abs() < 1e-6, "{f:?}");
        // A "step end" 2 ms before the first token is its own step's, seen spread out: the
        // wait is taken from the arrival, not read as 2 ms.
        let spread: Vec<Request> = (0..20).map(|i| round(i, Some(0.114))).collect();
        let f = fit(&spread, flat).expect("a fit");
        assert!((f.per_token / 0.000_1 - 1.06).abs() < 1e-6, "{f:?}");
    }

    #[test]
    fn placed_waits_give_their_median_and_too_few_give_way_to_the_arrivals() {
        // Placed waits read a little short or long by the two sightings' lags (here -2 ms to
        // +2 ms on a 100 ms prefill): the median, not the shortest.
        let t0 = Instant::now();
        let round = |i: u32, placed: bool| {
            let arrival = t0 + Duration::from_secs(u64::from(i));
            let lag = 0.001 * (f64::from(i % 5) - 2.0);
            Request {
                arrival,
                at: arrival + Duration::from_millis(500),
                step_end: placed.then(|| arrival + Duration::from_secs_f64(0.006 - lag)),
                ..req(0, 1000, 0, 0.006 + 0.010 + 0.1, None)
            }
        };
        let rs: Vec<Request> = (0..20).map(|i| round(i, true)).collect();
        let f = fit(&rs, flat).expect("a fit");
        assert_eq!(f.samples, 20);
        assert!((f.per_token / 0.000_1 - 1.0).abs() < 1e-6, "{f:?}");
        // Seven placed of twenty: fewer than the fit needs, so all twenty from the arrival.
        let rs: Vec<Request> = (0..20).map(|i| round(i, i < 7)).collect();
        let f = fit(&rs, flat).expect("a fit");
        assert_eq!(f.samples, 20);
        assert!((f.per_token / 0.000_1 - 1.06).abs() < 1e-6, "{f:?}");
    }

    #[test]
    fn open_loop_arrivals_wait_for_the_running_step_which_is_not_prefill() {
        // Poisson-like arrivals, one per step, each waiting for the running step's remainder
        // (uniform over the step) before its own: 256-token prompts at 0.05 ms, 35 in flight.
        let t0 = Instant::now();
        let step = sim_step(35.0);
        let rs: Vec<Request> = (0..200u32)
            .map(|i| {
                let arrival = t0 + Duration::from_millis(170 * u64::from(i));
                let remainder = step * f64::from((i * 37) % 100) / 100.0;
                let ttft = remainder + step + 0.000_05 * 256.0;
                Request {
                    batch: Some(35.0),
                    arrival,
                    at: arrival + Duration::from_secs(8),
                    ..req(i, 256, 0, ttft, None)
                }
            })
            .collect();
        let f = fit(&rs, sim_step).expect("a fit");
        assert!((f.per_token / 0.000_05 - 1.0).abs() < 0.25, "{f:?}");
    }
}

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
//! otherwise the time from the **last** member's arrival (plus its stated queue time, where only
//! that is stated) to the first token: the step cannot have started before its last member
//! arrived, so what is left over is the running step's remainder and queueing, which only ever
//! add. The estimate is then a low quantile ([`QUANTILE`]) of the groups': it assumes that one
//! group in twenty arrived just as a step began, which any window of more than a few dozen
//! steps has.

use super::workload::Request;

/// Groups whose uncached prompts add up to fewer tokens are left out: their prefill is lost in
/// the step and the network.
pub const MIN_UNCACHED: u32 = 32;

/// Estimates (groups) needed before the cost is believed.
pub const MIN_SAMPLES: usize = 8;

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
    let mut per_token: Vec<f64> = long
        .iter()
        .filter_map(|g| {
            let of = || g.iter().map(|&i| &requests[i]);
            let uncached: u32 = of().map(Request::uncached).sum();
            // The step's batch: the group's own size at least, and the requests in flight
            // beside them as the members saw it.
            let seen = of().filter_map(|r| r.batch).fold(0.0, f64::max);
            let batch = seen.max(g.len() as f64);
            let wait = match source {
                PrefillSource::Stated => of().filter_map(|r| r.stated_prefill).reduce(f64::min)?,
                _ => {
                    let first = of().filter_map(Request::first_token).min()?;
                    let start = of()
                        .map(|r| {
                            let queued = r.stated_queue.filter(|q| q.is_finite() && *q > 0.0);
                            r.arrival
                                + queued.map_or(std::time::Duration::ZERO, |q| {
                                    std::time::Duration::try_from_secs_f64(q).unwrap_or_default()
                                })
                        })
                        .max()?;
                    first.saturating_duration_since(start).as_secs_f64()
                }
            };
            wait.is_finite()
                .then(|| (wait - step(batch)).max(0.0) / f64::from(uncached))
        })
        .collect();
    if per_token.len() < min.max(1) {
        return None;
    }
    per_token.sort_by(f64::total_cmp);
    let rank = ((QUANTILE * per_token.len() as f64).ceil() as usize).clamp(1, per_token.len());
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

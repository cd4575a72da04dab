//! The engine's prefill cost per uncached prompt token, from the first tokens of the window.
//!
//! Prefill is compute-bound: its cost grows with the prompt, less what the prefix cache serves.
//! A request's first token comes at the end of the step that ran its prefill, so its wait is
//! any queueing, plus one decode step, plus `per_token x uncached`. Each request with a prompt
//! long enough to be more than noise gives one estimate, `(wait - step) / uncached`, where the
//! wait is the engine's own prefill time when its stream states it (no queue in it), and the
//! proxy's TTFT otherwise, less the engine's stated queue time where only that is stated. Queueing only ever adds, so the estimate is a low quantile of them
//! ([`QUANTILE`]): it assumes that at least one request in ten met an engine with no prefill
//! ahead of it, which a window with any quiet moment has; a window spent wholly saturated reads
//! high, which errs towards a smaller limit.

use super::workload::Request;

/// Shorter uncached prompts are left out: their prefill is lost in the step and the network.
pub const MIN_UNCACHED: u32 = 32;

/// Estimates needed before the cost is believed.
pub const MIN_SAMPLES: usize = 8;

/// The quantile of the estimates taken as the cost.
pub const QUANTILE: f64 = 0.1;

/// Where the waits came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The engine's stated prefill times (`--enable-per-request-metrics` and the like).
    Stated,
    /// The proxy's TTFT.
    Wire,
    /// No prompt in the window was long enough: prefill is taken as free.
    None,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Stated => "stated",
            Source::Wire => "wire",
            Source::None => "none",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefillFit {
    /// Seconds per uncached prompt token.
    pub per_token: f64,
    /// Requests the cost was read from.
    pub samples: usize,
    pub source: Source,
}

/// The cost from `requests`, given what a decode step costs alone (`step`, seconds); `None`
/// while fewer than [`MIN_SAMPLES`] long prompts have been seen but some have.
pub fn fit(requests: &[Request], step: f64) -> Option<PrefillFit> {
    let long: Vec<&Request> = requests
        .iter()
        .filter(|r| r.uncached() >= MIN_UNCACHED)
        .collect();
    if long.is_empty() {
        return Some(PrefillFit {
            per_token: 0.0,
            samples: 0,
            source: Source::None,
        });
    }
    let stated = long.iter().filter(|r| r.stated_prefill.is_some()).count();
    let (source, wait): (Source, fn(&Request) -> Option<f64>) = if 2 * stated >= long.len() {
        (Source::Stated, |r| r.stated_prefill)
    } else {
        (Source::Wire, |r| {
            Some(r.ttft? - r.stated_queue.unwrap_or(0.0))
        })
    };
    let mut per_token: Vec<f64> = long
        .iter()
        .filter_map(|r| {
            let w = wait(r)?;
            w.is_finite()
                .then(|| (w - step).max(0.0) / f64::from(r.uncached()))
        })
        .collect();
    if per_token.len() < MIN_SAMPLES {
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
    use std::time::Instant;

    use super::*;

    fn req(prompt: u32, cached: u32, ttft: f64, stated: Option<f64>) -> Request {
        Request {
            at: Instant::now(),
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

    #[test]
    fn a_stated_queue_comes_off_the_wire_wait() {
        // Every request queued 2 s at the engine, which says so; its prefill it does not state.
        let rs: Vec<Request> = (0..10)
            .map(|_| Request {
                stated_queue: Some(2.0),
                tps: None,
                batch: None,
                ..req(1000, 0, 2.0 + 0.010 + 0.2, None)
            })
            .collect();
        let f = fit(&rs, 0.010).expect("a fit");
        assert_eq!(f.source, Source::Wire);
        assert!((f.per_token - 0.0002).abs() < 1e-12, "{f:?}");
    }

    #[test]
    fn the_cost_is_the_low_quantile_of_the_waits_less_a_step() {
        // 0.2 ms per token and a 10 ms step; nine of twenty requests queued behind others.
        let mut rs: Vec<Request> = (0..11)
            .map(|i| {
                req(
                    2000 + 100 * i,
                    0,
                    0.010 + 0.0002 * f64::from(2000 + 100 * i),
                    None,
                )
            })
            .collect();
        rs.extend((0..9).map(|i| req(2000, 0, 0.41 + 0.4 * f64::from(i + 1), None)));
        let f = fit(&rs, 0.010).expect("a fit");
        assert_eq!((f.samples, f.source), (20, Source::Wire));
        assert!((f.per_token - 0.0002).abs() < 1e-12, "{f:?}");
    }

    #[test]
    fn stated_prefill_wins_and_cached_tokens_cost_nothing() {
        // Queued for a second each on the wire, but the engine states 0.25 s of prefill for
        // 1000 uncached tokens of 3000 (2000 served by the cache).
        let rs: Vec<Request> = (0..10).map(|_| req(3000, 2000, 1.25, Some(0.25))).collect();
        let f = fit(&rs, 0.010).expect("a fit");
        assert_eq!(f.source, Source::Stated);
        assert!((f.per_token - 0.00024).abs() < 1e-12, "{f:?}");
    }

    #[test]
    fn short_prompts_leave_prefill_free_and_few_long_ones_wait() {
        let short: Vec<Request> = (0..50).map(|_| req(20, 0, 0.02, None)).collect();
        let f = fit(&short, 0.010).expect("a fit");
        assert_eq!((f.per_token, f.source), (0.0, Source::None));
        let few: Vec<Request> = (0..3).map(|_| req(500, 0, 0.2, None)).collect();
        assert_eq!(fit(&few, 0.010), None);
    }
}

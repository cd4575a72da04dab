//! The model checks itself: at the concurrency actually seen, what it predicts beside what the
//! proxy measured.
//!
//! Every answer the model gives is a prediction at concurrencies the engine may never have run
//! at; the one place it can be held to the truth is where the engine runs now. So at each refit
//! the replay is run at the mean number of requests in flight per engine over the last minute
//! (rounded to a whole client), over that minute's own mix, and its TTFT p90 and median
//! per-request tokens/s are set beside the same figures of the requests that finished in that
//! minute. The error of each is `predicted / observed - 1`.
//!
//! Past [`MAX_ERROR`] on either, the answer is not to be trusted: the page and `tokenmeter
//! capacity` say so, and `tokenmeter_capacity_check_trusted` is 0, which an autoscaler should
//! read as "hold, do not act on utilization" (docs/capacity.md says what to do instead). The
//! usual causes: a workload that changed within the window, an engine the model does not
//! describe (speculative decoding, chunked prefill with a small budget, a KV cache it was not
//! told about), or a proxy that sees only part of the engine's traffic.

use std::time::{Duration, Instant};

use super::replay::{self, Engine, Load};
use super::workload::{self, Request};

/// The requests compared: those that finished within the last minute, the same minute the
/// concurrency is the mean of.
pub const WINDOW: Duration = Duration::from_secs(60);

/// The fewest finished requests the check is made on: with fewer, a p90 is one request's
/// TTFT, and the check says nothing rather than something random.
pub const MIN_REQUESTS: usize = 20;

/// The largest error, either way, at which the answer is trusted. The replay leaves out the
/// network and the engine's front end (about 10% of TTFT on the simulator) and the bench's
/// TTFT p90 at one level moves by some 20% between runs; past 50% the model describes another
/// engine or another workload than the one running.
pub const MAX_ERROR: f64 = 0.5;

/// One self-check.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Check {
    /// Requests in flight per engine the prediction is made at.
    pub concurrency: u32,
    /// TTFT p90, seconds: the model's and the last minute's requests'.
    pub ttft: Pair,
    /// Median per-request decode tokens/s; `None` where no request had two tokens.
    pub tps: Option<Pair>,
}

/// A prediction and what was measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pair {
    pub predicted: f64,
    pub observed: f64,
}

impl Pair {
    /// `predicted / observed - 1`; `None` when nothing was observed.
    pub fn error(&self) -> Option<f64> {
        (self.observed > 0.0).then(|| self.predicted / self.observed - 1.0)
    }
}

impl Check {
    /// True when every error that can be measured is within [`MAX_ERROR`].
    pub fn trusted(&self) -> bool {
        [Some(self.ttft), self.tps]
            .into_iter()
            .flatten()
            .all(|p| p.error().map_or(true, |e| e.abs() <= MAX_ERROR))
    }
}

/// The check at `in_flight` requests per engine, against the requests of `recent` that
/// finished within [`WINDOW`] of `now`, replayed on `engine` with that minute's own mix (a
/// window whose mix changed is held to what ran last, not to its average); `None` with fewer
/// than [`MIN_REQUESTS`] of them or no replay.
pub fn check(recent: &[Request], now: Instant, in_flight: f64, engine: Engine) -> Option<Check> {
    let last: Vec<Request> = recent
        .iter()
        .filter(|r| now.saturating_duration_since(r.at) <= WINDOW)
        .copied()
        .collect();
    let mut ttfts: Vec<f64> = last.iter().filter_map(|r| r.ttft).collect();
    if ttfts.len() < MIN_REQUESTS || !in_flight.is_finite() {
        return None;
    }
    let mut tps: Vec<f64> = last
        .iter()
        .filter_map(|r| r.tps)
        .filter(|t| t.is_finite())
        .collect();
    ttfts.sort_by(f64::total_cmp);
    tps.sort_by(f64::total_cmp);
    let concurrency = (in_flight.round() as u32).max(1);
    let replayed = replay::run(&engine, &workload::jobs(&last), Load::Closed(concurrency))?;
    let predicted_ttft = replayed.ttft_quantile(0.9)?;
    let predicted_tps = nearest_rank(&replayed.tps, 0.5);
    Some(Check {
        concurrency,
        ttft: Pair {
            predicted: predicted_ttft,
            observed: nearest_rank(&ttfts, 0.9)?,
        },
        tps: predicted_tps
            .zip(nearest_rank(&tps, 0.5))
            .map(|(p, o)| Pair {
                predicted: p,
                observed: o,
            }),
    })
}

fn nearest_rank(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::replay::{Job, LONG};

    fn finished(at: Instant, ttft: f64, tps: f64) -> Request {
        Request {
            at,
            arrival: at,
            prompt: 2000,
            cached: 0,
            output: 100,
            ttft: Some(ttft),
            stated_prefill: None,
            stated_queue: None,
            tps: Some(tps),
            batch: None,
        }
    }

    #[test]
    fn the_model_is_held_to_the_last_minute_at_the_concurrency_seen() {
        let now = Instant::now();
        let jobs = [Job {
            uncached: 2000,
            output: 100,
        }];
        // Four clients in step: the last waits 4 x 400 ms, and each one's decode is stalled by
        // the others' prefills. An engine that behaves so is what the model says.
        let four = replay::run(&LONG, &jobs, Load::Closed(4)).expect("a replay");
        let truth_ttft = four.ttft_quantile(0.9).expect("a p90");
        let truth_tps = four.tps[(four.tps.len() - 1) / 2];
        let at = now - Duration::from_secs(10);
        let honest: Vec<Request> = (0..30)
            .map(|_| finished(at, truth_ttft, truth_tps))
            .collect();
        let c = check(&honest, now, 3.7, LONG).expect("a check");
        assert_eq!(c.concurrency, 4);
        assert!(c.ttft.error().expect("an error").abs() < 1e-9, "{c:?}");
        let tps = c.tps.expect("tokens/s");
        assert!(tps.error().expect("an error").abs() < 1e-9, "{c:?}");
        assert!(c.trusted());
        // The engine is three times slower to the first token than the model says.
        let slow: Vec<Request> = (0..30)
            .map(|_| finished(at, 3.0 * truth_ttft, truth_tps))
            .collect();
        let c = check(&slow, now, 4.2, LONG).expect("a check");
        assert!(
            (c.ttft.error().expect("an error") + 2.0 / 3.0).abs() < 1e-9,
            "{c:?}"
        );
        assert!(!c.trusted());
        // Too few requests in the last minute, or only older ones: no check.
        assert_eq!(check(&honest[..19], now, 4.0, LONG), None);
        let old: Vec<Request> = (0..30)
            .map(|_| finished(now - Duration::from_secs(61), truth_ttft, truth_tps))
            .collect();
        assert_eq!(check(&old, now + Duration::from_secs(0), 4.0, LONG), None);
    }
}

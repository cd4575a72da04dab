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

use super::replay::{self, Arrival, Engine, Job};
use super::workload::Request;
use crate::quantile::nearest_rank;

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

/// The check of the requests of `recent` that finished within [`WINDOW`] of `now`, replayed
/// on `engine` among every request of `recent` as they arrived (the older ones fill the engine
/// as they did); `in_flight` (per engine) is the concurrency the check is reported at. `None`
/// with fewer than [`MIN_REQUESTS`] such requests or no replay.
pub fn check(recent: &[Request], now: Instant, in_flight: f64, engine: Engine) -> Option<Check> {
    let measured = |r: &Request| now.saturating_duration_since(r.at) <= WINDOW;
    let last: Vec<&Request> = recent.iter().filter(|r| measured(r)).collect();
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
    let replayed = replay::trace(&engine, &arrivals(recent, measured))?;
    let predicted_ttft = replayed.ttft_quantile(0.9)?;
    let predicted_tps = nearest_rank(&replayed.tps, 0.5);
    Some(Check {
        concurrency: (in_flight.round() as u32).max(1),
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

/// `recent` as a trace, ascending by arrival, from the first arrival; `measured` says which
/// requests the check compares.
fn arrivals(recent: &[Request], measured: impl Fn(&Request) -> bool) -> Vec<Arrival> {
    let mut sorted: Vec<&Request> = recent.iter().collect();
    sorted.sort_by_key(|r| r.arrival);
    let Some(origin) = sorted.first().map(|r| r.arrival) else {
        return Vec::new();
    };
    sorted
        .iter()
        .map(|r| Arrival {
            at: r.arrival.saturating_duration_since(origin).as_secs_f64(),
            job: Job {
                uncached: r.uncached(),
                output: r.output.max(1),
            },
            measured: measured(r),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::replay::{Load, LONG};

    /// A request that arrived at `arrival` and took what `LONG` gives a client alone: its
    /// prefill step (410.2 ms) and 99 steps of 10.2 ms.
    fn finished(arrival: Instant, ttft: f64, tps: f64) -> Request {
        Request {
            at: arrival + Duration::from_secs_f64(0.4102 + 99.0 * 0.0102),
            arrival,
            prompt: 2000,
            cached: 0,
            output: 100,
            ttft: Some(ttft),
            stated_prefill: None,
            stated_queue: None,
            step_end: None,
            tps: Some(tps),
            batch: None,
        }
    }

    #[test]
    fn the_model_is_held_to_the_last_minute_as_it_arrived() {
        let now = Instant::now();
        // One request every 2 s for the last 80 s: each meets an idle engine, so each waits for
        // its own prefill step and decodes alone. An engine that behaves so is what the model
        // says.
        let alone = replay::run(
            &LONG,
            &[Job {
                uncached: 2000,
                output: 100,
            }],
            Load::Closed(1),
        )
        .expect("a replay");
        let (ttft, tps) = (alone.ttft[0], alone.tps[0]);
        let start = now - Duration::from_secs(82);
        let honest: Vec<Request> = (0..40)
            .map(|i| finished(start + Duration::from_secs(2 * i), ttft, tps))
            .collect();
        let c = check(&honest, now, 0.7, LONG).expect("a check");
        assert_eq!(c.concurrency, 1);
        assert!(c.ttft.error().expect("an error").abs() < 1e-6, "{c:?}");
        let t = c.tps.expect("tokens/s");
        assert!(t.error().expect("an error").abs() < 1e-6, "{c:?}");
        assert!(c.trusted());
        // The engine is three times slower to the first token than the model says.
        let slow: Vec<Request> = (0..40)
            .map(|i| finished(start + Duration::from_secs(2 * i), 3.0 * ttft, tps))
            .collect();
        let c = check(&slow, now, 0.7, LONG).expect("a check");
        assert!(
            (c.ttft.error().expect("an error") + 2.0 / 3.0).abs() < 1e-6,
            "{c:?}"
        );
        assert!(!c.trusted());
        // Too few requests in the last minute, or only older ones: no check.
        assert_eq!(check(&honest[..30], now, 1.0, LONG), None);
        let old: Vec<Request> = (0..40)
            .map(|i| finished(now - Duration::from_secs(200 - i), ttft, tps))
            .collect();
        assert_eq!(check(&old, now, 1.0, LONG), None);
    }

    #[test]
    fn requests_that_arrived_together_are_replayed_together() {
        let now = Instant::now();
        // Bursts of four every 5 s: the last of each burst waits for four prefills, as the
        // replay of the burst does; a replay of four clients on their own would say one.
        let mut burst = Vec::new();
        for b in 0..16u64 {
            let at = now - Duration::from_secs(80) + Duration::from_secs(5 * b);
            for i in 0..4u64 {
                let ttft = 0.0102 + 0.4 * (i + 1) as f64;
                burst.push(finished(at + Duration::from_micros(10 * i), ttft, 90.0));
            }
        }
        let c = check(&burst, now, 1.5, LONG).expect("a check");
        assert!(c.ttft.error().expect("an error").abs() < 0.05, "{c:?}");
    }
}

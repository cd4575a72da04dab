//! The page's memory: a bounded ring of readings the sampler takes on a timer.
//!
//! Every `--ui-sample-period` (default 5 s) the sampler reads the registry once (the same
//! rendering `/metrics` serves) and [`History::record`]s it. That is all the page costs: no work
//! per request or per chunk, and memory bounded by [`HISTORY_SPAN`] / period points plus the
//! readings of the last [`NOW_WINDOW`]. From the ring come:
//! - the time series (aggregate tokens/s, TTFT, requests in flight) of the last ten minutes;
//! - the base the "now" percentiles are measured from (the newest reading at least
//!   [`NOW_WINDOW`] old), so they say what happened in the last minute, not since start;
//! - aggregate tokens/s by concurrency band, accumulated since start (see [`BandAcc`]).
//!
//! The aggregate gauge (`tokenmeter_output_tokens_per_second`) is a mean over `--rate-window`, so
//! a reading is put in the band of the mean number of requests in flight over the readings of
//! that same window: both coordinates of a point describe the same stretch of time. Where load
//! changes within a window, the point lies between two levels, where it belongs.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::reading::{Hist, PartSum, Reading};
use crate::record::concurrency_band;

/// How far back the time series reach: what a person glancing at the page wants to see.
pub const HISTORY_SPAN: Duration = Duration::from_secs(600);

/// The "now" percentiles cover this much recent time: long enough to hold some requests at a
/// few per second, short enough to follow a change of load within a minute.
pub const NOW_WINDOW: Duration = Duration::from_secs(60);

/// One point of the time series.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Point {
    /// When the reading was taken (Unix time, milliseconds).
    pub unix_ms: u64,
    /// `tokenmeter_output_tokens_per_second` at that moment (its own `--rate-window`).
    pub output_tokens_per_second: f64,
    /// TTFT percentiles of the requests recorded since the previous point; `None` when none were.
    pub ttft_p50_seconds: Option<f64>,
    pub ttft_p99_seconds: Option<f64>,
    /// `tokenmeter_requests_in_flight` by phase at that moment.
    pub in_flight_prefill: f64,
    pub in_flight_decode: f64,
}

/// Aggregate tokens/s in one concurrency band: the mean of the aggregate gauge over the readings
/// whose window (the gauge's `--rate-window`) had a mean number of requests in flight in that
/// band. Readings whose window averaged less than one request in flight (idle) are left out.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BandAcc {
    pub samples: u64,
    pub tokens_per_second_sum: f64,
    pub in_flight_sum: f64,
}

/// The cumulative values a later reading is compared with.
#[derive(Debug, Clone)]
pub(crate) struct Base {
    pub at: Instant,
    pub unix_ms: u64,
    pub ttft: Hist,
    pub ttft_parts: BTreeMap<String, PartSum>,
    pub request_tps: Hist,
    pub slo: BTreeMap<(String, String), f64>,
}

impl Base {
    fn of(r: &Reading, at: Instant, unix_ms: u64) -> Base {
        Base {
            at,
            unix_ms,
            ttft: r.ttft.clone(),
            ttft_parts: r.ttft_parts.clone(),
            request_tps: r.request_tps.clone(),
            slo: r.slo.clone().unwrap_or_default(),
        }
    }
}

/// The ring (see the module docs).
#[derive(Debug)]
pub struct History {
    period: Duration,
    rate_window: Duration,
    capacity: usize,
    /// Requests in flight at each reading of the last `rate_window`.
    recent: VecDeque<(Instant, f64)>,
    /// The first reading: until it is `rate_window` old, the gauge's window reaches back
    /// before the readings, and no reading is put in a band.
    first: Option<Instant>,
    points: VecDeque<Point>,
    bases: VecDeque<Base>,
    bands: BTreeMap<&'static str, BandAcc>,
}

impl History {
    /// A ring for readings taken every `period` of a registry whose aggregate gauge averages
    /// over `rate_window`.
    pub fn new(period: Duration, rate_window: Duration) -> History {
        let period = period.max(Duration::from_millis(1));
        let capacity = (HISTORY_SPAN.as_secs_f64() / period.as_secs_f64()).ceil() as usize;
        History {
            period,
            rate_window,
            capacity: capacity.max(1),
            recent: VecDeque::new(),
            first: None,
            points: VecDeque::new(),
            bases: VecDeque::new(),
            bands: BTreeMap::new(),
        }
    }

    pub fn period(&self) -> Duration {
        self.period
    }

    /// Takes one reading, made at `at` (monotonic) and `unix_ms` (for display).
    pub fn record(&mut self, r: &Reading, at: Instant, unix_ms: u64) {
        let interval = match self.bases.back() {
            Some(prev) => r.ttft.since(&prev.ttft),
            None => r.ttft.clone(),
        };
        self.points.push_back(Point {
            unix_ms,
            output_tokens_per_second: r.output_tps,
            ttft_p50_seconds: interval.quantile(0.5),
            ttft_p99_seconds: interval.quantile(0.99),
            in_flight_prefill: r.in_flight_prefill,
            in_flight_decode: r.in_flight_decode,
        });
        while self.points.len() > self.capacity {
            self.points.pop_front();
        }
        self.bases.push_back(Base::of(r, at, unix_ms));
        // Keep the newest base at least NOW_WINDOW old, and everything after it.
        if let Some(edge) = at.checked_sub(NOW_WINDOW) {
            while self.bases.len() >= 2 && self.bases[1].at <= edge {
                self.bases.pop_front();
            }
        }
        self.recent
            .push_back((at, r.in_flight_prefill + r.in_flight_decode));
        if let Some(edge) = at.checked_sub(self.rate_window) {
            while self.recent.front().is_some_and(|(t, _)| *t < edge) {
                self.recent.pop_front();
            }
        }
        let in_flight = self.recent.iter().map(|(_, n)| n).sum::<f64>() / self.recent.len() as f64;
        let first = *self.first.get_or_insert(at);
        let covered = at.saturating_duration_since(first) >= self.rate_window;
        if covered && in_flight >= 1.0 {
            let acc = self.bands.entry(concurrency_band(in_flight)).or_default();
            acc.samples += 1;
            acc.tokens_per_second_sum += r.output_tps;
            acc.in_flight_sum += in_flight;
        }
    }

    /// The time series, oldest first.
    pub fn points(&self) -> impl Iterator<Item = &Point> {
        self.points.iter()
    }

    /// What the "now" figures at `at` are measured from: the newest reading at least
    /// [`NOW_WINDOW`] old; `None` means since the process started.
    pub(crate) fn base_for(&self, at: Instant) -> Option<&Base> {
        let edge = at.checked_sub(NOW_WINDOW)?;
        self.bases.iter().rev().find(|b| b.at <= edge)
    }

    /// Aggregate tokens/s by concurrency band, since start.
    pub fn bands(&self) -> &BTreeMap<&'static str, BandAcc> {
        &self.bands
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn reading(tps: f64, prefill: f64, decode: f64, ttft: &[(f64, f64)]) -> Reading {
        Reading {
            output_tps: tps,
            in_flight_prefill: prefill,
            in_flight_decode: decode,
            ttft: Hist {
                buckets: ttft.to_vec(),
                sum: 0.0,
                count: ttft.last().map_or(0.0, |b| b.1),
            },
            ..Reading::default()
        }
    }

    const PERIOD: Duration = Duration::from_secs(5);
    const WINDOW: Duration = Duration::from_secs(10);

    #[test]
    fn the_ring_is_bounded_and_keeps_the_newest() {
        let mut h = History::new(PERIOD, WINDOW);
        let t0 = Instant::now();
        for i in 0..500u64 {
            let r = reading(i as f64, 0.0, 0.0, &[]);
            h.record(&r, t0 + Duration::from_secs(5 * i), i);
        }
        assert_eq!(h.points().count(), 120);
        assert_eq!(h.points().next().unwrap().unix_ms, 380);
        // Bases: the newest one at least 60 s old (12 periods) and the 12 after it.
        assert_eq!(h.bases.len(), 13);
        let at = t0 + Duration::from_secs(5 * 499);
        assert_eq!(h.base_for(at).unwrap().unix_ms, 499 - 12);
        assert!(h.base_for(t0 + Duration::from_secs(30)).is_none());
        // The window's in-flight readings: t-10 s, t-5 s and t.
        assert_eq!(h.recent.len(), 3);
    }

    #[test]
    fn ttft_points_are_per_interval_and_bands_skip_idle_windows() {
        let mut h = History::new(PERIOD, WINDOW);
        let t0 = Instant::now();
        let inf = f64::INFINITY;
        // Two requests under 1 s, then two more between 1 and 2 s.
        h.record(
            &reading(0.0, 0.0, 0.0, &[(1.0, 2.0), (2.0, 2.0), (inf, 2.0)]),
            t0,
            0,
        );
        let r = reading(300.0, 1.0, 2.0, &[(1.0, 2.0), (2.0, 4.0), (inf, 4.0)]);
        h.record(&r, t0 + Duration::from_secs(5), 5000);
        let r = reading(100.0, 0.0, 1.0, &[(1.0, 2.0), (2.0, 4.0), (inf, 4.0)]);
        h.record(&r, t0 + Duration::from_secs(10), 10000);
        let r = reading(500.0, 1.0, 5.0, &[(1.0, 2.0), (2.0, 4.0), (inf, 4.0)]);
        h.record(&r, t0 + Duration::from_secs(15), 15000);
        let p: Vec<_> = h.points().map(|p| p.ttft_p50_seconds).collect();
        assert_eq!(p, [Some(0.5), Some(1.5), None, None]);
        // Windows of 10 s: at 5 s the gauge's window reaches back before the first reading, so
        // it is not used; at 10 s (0, 3, 1) has mean 4/3, band 1; at 15 s (3, 1, 6) mean 10/3,
        // band 2-4.
        let b = h.bands();
        assert_eq!(b.len(), 2);
        assert_eq!(b["2-4"].samples, 1);
        assert_eq!(b["2-4"].tokens_per_second_sum, 500.0);
        assert_eq!(b["2-4"].in_flight_sum, 10.0 / 3.0);
        assert_eq!(b["1"].samples, 1);
        assert_eq!(b["1"].tokens_per_second_sum, 100.0);
        assert_eq!(b["1"].in_flight_sum, 4.0 / 3.0);
    }
}

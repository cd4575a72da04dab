//! One gathering of the registry reduced to what the page shows: [`Reading::from_families`].
//!
//! This module reads metric names; it does not define them: they come from `crate::metrics`,
//! which registers the families under the same constants. Series are summed
//! over the labels the page does not break down by (model, code, api, prompt band), as a PromQL
//! `sum by (...)` would.

use std::collections::BTreeMap;

use prometheus::proto::{MetricFamily, MetricType};

use crate::metrics::names::capacity;
use crate::metrics::names::cost;
use crate::quantile::histogram_quantile;

// The names the page reads the exposition by, under the short names its code uses.
pub(crate) use crate::metrics::names::{
    BUILD_INFO, GPUS, INPUT_TOKENS_TOTAL as INPUT_TOKENS, OUTPUT_TOKENS_PER_SECOND as OUTPUT_TPS,
    OUTPUT_TOKENS_PER_SECOND_PER_GPU as OUTPUT_TPS_PER_GPU, OUTPUT_TOKENS_TOTAL as OUTPUT_TOKENS,
    REQUESTS_IN_FLIGHT as IN_FLIGHT, REQUESTS_TOTAL as REQUESTS,
    REQUEST_TOKENS_PER_SECOND as REQUEST_TPS, SLO_OBJECTIVE, SLO_REQUESTS_TOTAL as SLO_REQUESTS,
    START_TIME_SECONDS as START_TIME, TIME_TO_FIRST_TOKEN_PART_SECONDS as TTFT_PART,
    TIME_TO_FIRST_TOKEN_SECONDS as TTFT, TOKEN_COUNT_SOURCE_TOTAL as TOKEN_SOURCE,
    WORKLOAD_LOG_DROPPED_TOTAL as WORKLOAD_LOG_DROPPED,
    WORKLOAD_LOG_LINES_TOTAL as WORKLOAD_LOG_LINES,
    WORKLOAD_LOG_SKIPPED_TOTAL as WORKLOAD_LOG_SKIPPED,
};
pub(crate) const CAPACITY_CURVE: &str = capacity::CURVE_TPS;
pub(crate) const CAPACITY_MAX_CONCURRENCY: &str = capacity::MAX_CONCURRENCY;
pub(crate) const CAPACITY_TPS_FLOOR: &str = capacity::TPS_FLOOR;

/// A histogram summed over series: cumulative counts by upper bound, ascending, `+Inf` last.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Hist {
    pub buckets: Vec<(f64, f64)>,
    pub sum: f64,
    pub count: f64,
}

impl Hist {
    fn add_bucket(&mut self, le: f64, v: f64) {
        match self.buckets.iter_mut().find(|(b, _)| *b == le) {
            Some((_, c)) => *c += v,
            None => {
                self.buckets.push((le, v));
                self.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            }
        }
    }

    /// What was observed since `base` (an earlier reading of the same histogram).
    pub fn since(&self, base: &Hist) -> Hist {
        let before = |le: f64| {
            base.buckets
                .iter()
                .find(|(b, _)| *b == le)
                .map_or(0.0, |p| p.1)
        };
        Hist {
            buckets: self
                .buckets
                .iter()
                .map(|&(le, c)| (le, (c - before(le)).max(0.0)))
                .collect(),
            sum: self.sum - base.sum,
            count: (self.count - base.count).max(0.0),
        }
    }

    /// The `q`-quantile by linear interpolation inside its bucket, as PromQL's
    /// `histogram_quantile` does ([`histogram_quantile`]); `None` for an empty histogram.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        histogram_quantile(q, &self.buckets).map(|(v, _)| v)
    }
}

/// One part of TTFT summed over series: its seconds and its observations.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PartSum {
    pub sum: f64,
    pub count: f64,
}

impl PartSum {
    /// What was observed since `base`.
    pub fn since(&self, base: Option<&PartSum>) -> PartSum {
        let b = base.copied().unwrap_or_default();
        PartSum {
            sum: (self.sum - b.sum).max(0.0),
            count: (self.count - b.count).max(0.0),
        }
    }
}

/// One point of the capacity model's curve.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CurvePoint {
    pub concurrency: f64,
    pub tokens_per_second: f64,
}

/// What one scrape says, in the shape the page needs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reading {
    pub version: Option<String>,
    pub start_time: Option<f64>,
    pub in_flight_prefill: f64,
    pub in_flight_decode: f64,
    pub output_tps: f64,
    pub output_tps_per_gpu: f64,
    pub gpus: f64,
    pub ttft: Hist,
    /// The parts of TTFT the engines state, by `part`: seconds summed and requests observed.
    pub ttft_parts: BTreeMap<String, PartSum>,
    pub request_tps: Hist,
    /// Per-request tokens/s by concurrency band.
    pub request_tps_by_band: BTreeMap<String, Hist>,
    pub outcomes: BTreeMap<String, f64>,
    pub codes: BTreeMap<String, f64>,
    pub token_sources: BTreeMap<String, f64>,
    pub requests: f64,
    pub output_tokens: f64,
    pub input_tokens: f64,
    /// `tokenmeter_slo_requests_total` by (class, result); `None` when the family is absent.
    pub slo: Option<BTreeMap<(String, String), f64>>,
    pub slo_objective: BTreeMap<String, f64>,
    /// The capacity model's curve by kind (`per_request`, `aggregate`); empty when absent.
    pub capacity_curve: BTreeMap<String, Vec<CurvePoint>>,
    pub capacity_max_concurrency: BTreeMap<String, f64>,
    /// Each class's per-request speed floor, as the capacity model uses it.
    pub capacity_tps_floor: BTreeMap<String, f64>,
    /// Each class's two limits by `bound` (`ttft`, `tokens_per_second`).
    pub capacity_limits: BTreeMap<String, BTreeMap<String, f64>>,
    /// The mix the first-token predictions assume: mean tokens per request by kind, and
    /// `requests`.
    pub capacity_workload: BTreeMap<String, f64>,
    /// The model's self-check: `concurrency`, `ttft_predicted`, `ttft_observed`,
    /// `tps_predicted`, `tps_observed`, `trusted`; empty when not exported.
    pub capacity_check: BTreeMap<String, f64>,
    /// Why the capacity model cannot answer yet (the `reason` of
    /// `tokenmeter_capacity_unsupported` that reads 1); `None` while it answers.
    pub capacity_unsupported: Option<String>,
    /// GPU-seconds charged by tenant (`""` without the label), idle, and held by the requests
    /// in flight.
    pub gpu_by_tenant: BTreeMap<String, f64>,
    pub gpu_idle: f64,
    pub gpu_unassigned: f64,
    /// The workload trace's lines (`written`, `dropped`, `skipped`); empty without
    /// `--workload-log`.
    pub workload_log: BTreeMap<String, f64>,
}

fn bump(map: &mut BTreeMap<String, f64>, key: Option<&str>, v: f64) {
    *map.entry(key.unwrap_or("").to_string()).or_default() += v;
}

impl Reading {
    /// Reduces the metric families of one gathering of a registry.
    pub fn from_families(families: &[MetricFamily]) -> Reading {
        let mut r = Reading::default();
        for family in families {
            let name = family.name();
            for m in family.get_metric() {
                let label = |k: &str| {
                    m.get_label()
                        .iter()
                        .find(|l| l.name() == k)
                        .map(|l| l.value())
                };
                let v = match family.get_field_type() {
                    MetricType::HISTOGRAM => {
                        let h = m.get_histogram();
                        if name == TTFT_PART {
                            let part = r
                                .ttft_parts
                                .entry(label("part").unwrap_or("").to_string())
                                .or_default();
                            part.sum += h.get_sample_sum();
                            part.count += h.get_sample_count() as f64;
                            continue;
                        }
                        let target = match name {
                            TTFT => &mut r.ttft,
                            REQUEST_TPS => r
                                .request_tps_by_band
                                .entry(label("concurrency").unwrap_or("").to_string())
                                .or_default(),
                            _ => continue,
                        };
                        add_histogram(target, h);
                        if name == REQUEST_TPS {
                            add_histogram(&mut r.request_tps, h);
                        }
                        continue;
                    }
                    MetricType::COUNTER => m.get_counter().get_value(),
                    MetricType::GAUGE => m.get_gauge().get_value(),
                    // tokenmeter registers no untyped or summary families.
                    MetricType::UNTYPED | MetricType::SUMMARY => continue,
                };
                r.scalar(name, label, v);
            }
        }
        r
    }

    /// Takes one sample of a counter or gauge.
    fn scalar<'a>(&mut self, name: &str, label: impl Fn(&str) -> Option<&'a str>, v: f64) {
        let r = self;
        let class = || label("class").unwrap_or("").to_string();
        match name {
            IN_FLIGHT => match label("phase") {
                Some("prefill") => r.in_flight_prefill += v,
                Some("decode") => r.in_flight_decode += v,
                _ => {}
            },
            OUTPUT_TPS => r.output_tps = v,
            OUTPUT_TPS_PER_GPU => r.output_tps_per_gpu = v,
            GPUS => r.gpus += v,
            BUILD_INFO => r.version = label("version").map(str::to_string),
            START_TIME => r.start_time = Some(v),
            REQUESTS => {
                r.requests += v;
                bump(&mut r.outcomes, label("outcome"), v);
                bump(&mut r.codes, label("code"), v);
            }
            OUTPUT_TOKENS => r.output_tokens += v,
            INPUT_TOKENS => r.input_tokens += v,
            TOKEN_SOURCE => bump(&mut r.token_sources, label("source"), v),
            SLO_REQUESTS => {
                let key = (class(), label("result").unwrap_or("").to_string());
                *r.slo
                    .get_or_insert_with(BTreeMap::new)
                    .entry(key)
                    .or_default() += v;
            }
            SLO_OBJECTIVE => {
                r.slo_objective.insert(class(), v);
            }
            CAPACITY_CURVE => {
                let (Some(kind), Some(c)) = (
                    label("kind"),
                    label("concurrency").and_then(|c| c.parse::<f64>().ok()),
                ) else {
                    return;
                };
                if v.is_finite() {
                    let curve = r.capacity_curve.entry(kind.to_string()).or_default();
                    curve.push(CurvePoint {
                        concurrency: c,
                        tokens_per_second: v,
                    });
                    curve.sort_by(|a, b| a.concurrency.total_cmp(&b.concurrency));
                }
            }
            CAPACITY_MAX_CONCURRENCY => {
                r.capacity_max_concurrency.insert(class(), v);
            }
            CAPACITY_TPS_FLOOR => {
                r.capacity_tps_floor.insert(class(), v);
            }
            capacity::LIMIT_CONCURRENCY => {
                if let Some(bound) = label("bound") {
                    let limits = r.capacity_limits.entry(class()).or_default();
                    limits.insert(bound.to_string(), v);
                }
            }
            cost::GPU_SECONDS => bump(&mut r.gpu_by_tenant, label("tenant"), v),
            cost::GPU_IDLE_SECONDS => r.gpu_idle += v,
            cost::GPU_UNASSIGNED_SECONDS => r.gpu_unassigned += v,
            WORKLOAD_LOG_LINES => bump(&mut r.workload_log, Some("written"), v),
            WORKLOAD_LOG_DROPPED => bump(&mut r.workload_log, Some("dropped"), v),
            WORKLOAD_LOG_SKIPPED => bump(&mut r.workload_log, Some("skipped"), v),
            capacity::WORKLOAD_TOKENS => bump(&mut r.capacity_workload, label("kind"), v),
            capacity::WORKLOAD_REQUESTS => bump(&mut r.capacity_workload, Some("requests"), v),
            capacity::CHECK_CONCURRENCY => bump(&mut r.capacity_check, Some("concurrency"), v),
            capacity::CHECK_TRUSTED => bump(&mut r.capacity_check, Some("trusted"), v),
            capacity::UNSUPPORTED if v == 1.0 => {
                r.capacity_unsupported = label("reason").map(str::to_string);
            }
            capacity::CHECK_TTFT | capacity::CHECK_TPS => {
                let what = if name == capacity::CHECK_TTFT {
                    "ttft"
                } else {
                    "tps"
                };
                if let Some(source) = label("source") {
                    bump(&mut r.capacity_check, Some(&format!("{what}_{source}")), v);
                }
            }
            _ => {}
        }
    }
}

/// Adds one series of a gathered histogram (its `+Inf` bucket is the sample count).
fn add_histogram(target: &mut Hist, h: &prometheus::proto::Histogram) {
    for b in h.get_bucket() {
        target.add_bucket(b.upper_bound(), b.cumulative_count() as f64);
    }
    target.add_bucket(f64::INFINITY, h.get_sample_count() as f64);
    target.sum += h.get_sample_sum();
    target.count += h.get_sample_count() as f64;
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn h(buckets: &[(f64, f64)]) -> Hist {
        Hist {
            buckets: buckets.to_vec(),
            sum: 0.0,
            count: buckets.last().map_or(0.0, |b| b.1),
        }
    }

    #[test]
    fn quantile_follows_promql() {
        let x = h(&[(1.0, 10.0), (2.0, 20.0), (f64::INFINITY, 30.0)]);
        assert_eq!(x.quantile(0.5), Some(1.5));
        // Rank 3 of 30 is three tenths into the first bucket, which starts at 0.
        assert!((x.quantile(0.1).unwrap() - 0.3).abs() < 1e-12);
        // In the +Inf bucket: the highest finite bound.
        assert_eq!(x.quantile(0.9), Some(2.0));
        assert_eq!(h(&[(1.0, 0.0), (f64::INFINITY, 0.0)]).quantile(0.5), None);
        assert_eq!(Hist::default().quantile(0.5), None);
        // Empty buckets between are skipped: rank 2 of 4 lies in (0.2, 0.4].
        let y = h(&[(0.1, 1.0), (0.2, 1.0), (0.4, 3.0), (f64::INFINITY, 4.0)]);
        assert_eq!(y.quantile(0.5), Some(0.2 + 0.2 * 0.5));
    }

    #[test]
    fn since_subtracts_bucket_by_bucket() {
        let a = h(&[(1.0, 1.0), (f64::INFINITY, 2.0)]);
        let b = h(&[(1.0, 4.0), (f64::INFINITY, 8.0)]);
        assert_eq!(b.since(&a).buckets, [(1.0, 3.0), (f64::INFINITY, 6.0)]);
        assert_eq!(b.since(&a).count, 6.0);
        assert_eq!(b.since(&Hist::default()), b);
    }
}

//! `/api/summary`: everything the page shows, as one small JSON document (its fields are
//! documented in docs/page.md).
//!
//! It is computed from one rendering of the registry (the text `/metrics` serves, read back by
//! [`super::scrape`]) and the sampler's [`History`], so it agrees with `/metrics` by
//! construction. Percentiles come from histogram buckets by linear interpolation inside the
//! bucket, as PromQL's `histogram_quantile` does ([`Hist::quantile`]): they are only as fine as
//! the buckets.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Serialize;

use super::history::{History, Point};
use super::reading::{CurvePoint, Hist, PartSum, Reading};

/// The whole document.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PageSummary {
    pub version: Option<String>,
    pub generated_unix_ms: u64,
    pub sample_period_seconds: f64,
    /// How far back [`PageSummary::history`] reaches at most.
    pub history_span_seconds: f64,
    pub now: Now,
    /// `None` when neither `tokenmeter_slo_requests_total` nor `tokenmeter_slo_objective` is
    /// exported.
    pub slo: Option<Vec<SloClass>>,
    pub tradeoff: Tradeoff,
    pub history: Vec<Point>,
    pub outcomes: Vec<Count>,
    pub codes: Vec<Count>,
    pub token_sources: Vec<Count>,
    pub totals: Totals,
    pub gpu_time: GpuTime,
    /// The workload trace's state; `None` without `--workload-log`.
    pub workload_log: Option<WorkloadLog>,
}

/// The workload trace's lines since start (`--workload-log`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkloadLog {
    pub written: f64,
    /// Lost to a full queue or a failed write.
    pub dropped: f64,
    /// Requests for generation never sent upstream with a prompt: not in the trace.
    pub skipped: f64,
}

/// Who used the GPUs, since start: GPU-seconds charged by tenant, idle, and held by the
/// requests in flight (docs/cost.md).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuTime {
    /// By tenant; one row named `""` without the label.
    pub by_tenant: Vec<GpuShare>,
    pub idle_seconds: f64,
    pub unassigned_seconds: f64,
}

/// One tenant's GPU-seconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuShare {
    pub name: String,
    pub gpu_seconds: f64,
}

/// The window the "now" percentiles and SLO attainment cover.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Window {
    pub from_unix_ms: u64,
    pub seconds: f64,
}

/// The "now" figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Now {
    pub in_flight_prefill: f64,
    pub in_flight_decode: f64,
    pub output_tokens_per_second: f64,
    pub output_tokens_per_second_per_gpu: f64,
    pub gpus: f64,
    pub window: Window,
    pub ttft_requests: f64,
    pub ttft_p50_seconds: Option<f64>,
    pub ttft_p99_seconds: Option<f64>,
    pub request_tps_requests: f64,
    pub request_tokens_per_second_p50: Option<f64>,
    /// Of `ttft_requests`, those whose stream stated the engine's timings (their `other` part
    /// was observed).
    pub ttft_split_requests: f64,
    /// Where their TTFT went: each part's seconds over the split requests, in stacking order
    /// (`queue`, `model_load`, `prefill`, `other`; a part no request stated is left out), so the
    /// means add up to their mean TTFT. Empty when no request stated any.
    pub ttft_parts: Vec<TtftPart>,
}

/// One part of the TTFT split, over [`Now::window`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TtftPart {
    pub part: String,
    /// Requests that stated this part.
    pub requests: f64,
    /// The part's seconds summed over the window, divided by the split requests: its share of
    /// their mean TTFT (a part some requests did not state counts 0 for them).
    pub mean_seconds: f64,
}

/// SLO results of one class.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SloClass {
    pub class: String,
    pub objective: Option<f64>,
    /// Over [`Now::window`].
    pub window: Attainment,
    pub since_start: Attainment,
}

/// `met / (requests - client_disconnect)`: a request the client abandoned before it had missed
/// a target says nothing about the speed it got.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Attainment {
    pub requests: f64,
    pub met: f64,
    pub attainment: Option<f64>,
    pub results: BTreeMap<String, f64>,
}

/// The trade-off chart: per-request against aggregate speed by concurrency.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Tradeoff {
    pub bands: Vec<Band>,
    /// The capacity model's curve by kind (`per_request`, `aggregate`); empty when absent.
    pub capacity_curve: BTreeMap<String, Vec<CurvePoint>>,
    /// `tokenmeter_capacity_max_concurrency{class}`.
    pub max_concurrency: BTreeMap<String, f64>,
    /// `tokenmeter_capacity_tps_floor{class}`: each class's per-request speed floor.
    pub floors: Vec<Floor>,
    /// `tokenmeter_capacity_limit_concurrency{class, bound}`: each class's two limits.
    pub limits: BTreeMap<String, BTreeMap<String, f64>>,
    /// The mix the predictions assume (`tokenmeter_capacity_workload_tokens` by kind, and
    /// `requests`); `{}` when not exported.
    pub workload: BTreeMap<String, f64>,
    /// The model's self-check (`tokenmeter_capacity_check_*`): `concurrency`,
    /// `ttft_predicted`, `ttft_observed`, `tps_predicted`, `tps_observed`, `trusted`; `{}` when
    /// not exported.
    pub check: BTreeMap<String, f64>,
    /// Why the capacity model cannot answer yet, in words; `None` while it answers.
    pub unsupported: Option<String>,
}

/// A class's per-request speed floor.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Floor {
    pub class: String,
    pub tokens_per_second: f64,
}

/// One concurrency band, since the process started.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Band {
    pub band: String,
    /// Where the band is drawn: the geometric middle of its bounds.
    pub concurrency: f64,
    pub requests: f64,
    pub per_request_p50: Option<f64>,
    pub per_request_p90: Option<f64>,
    pub aggregate_samples: u64,
    pub aggregate_tokens_per_second: Option<f64>,
    pub aggregate_mean_in_flight: Option<f64>,
}

/// A count by one label value.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Count {
    pub name: String,
    pub requests: f64,
}

/// Since the process started.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Totals {
    pub requests: f64,
    pub output_tokens: f64,
    pub input_tokens: f64,
}

/// The bounds of a band label (`1`, `2-4`, `257+`).
fn band_bounds(band: &str) -> (f64, f64) {
    let num = |s: &str| s.trim().parse::<f64>().unwrap_or(0.0);
    if let Some(lo) = band.strip_suffix('+') {
        let lo = num(lo);
        return (lo, lo);
    }
    match band.split_once('-') {
        Some((lo, hi)) => (num(lo), num(hi)),
        None => (num(band), num(band)),
    }
}

fn counts(map: &BTreeMap<String, f64>) -> Vec<Count> {
    map.iter()
        .map(|(k, &v)| Count {
            name: k.clone(),
            requests: v,
        })
        .collect()
}

fn attainment(by_result: BTreeMap<String, f64>) -> Attainment {
    let requests: f64 = by_result.values().sum();
    let met = by_result.get("met").copied().unwrap_or(0.0);
    let abandoned = by_result.get("client_disconnect").copied().unwrap_or(0.0);
    let judged = requests - abandoned;
    Attainment {
        requests,
        met,
        attainment: (judged > 0.0).then(|| met / judged),
        results: by_result,
    }
}

fn per_class(
    slo: &BTreeMap<(String, String), f64>,
    base: Option<&BTreeMap<(String, String), f64>>,
) -> BTreeMap<String, BTreeMap<String, f64>> {
    let mut out: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    for ((class, result), &v) in slo {
        let before = base.and_then(|b| b.get(&(class.clone(), result.clone())));
        let v = (v - before.copied().unwrap_or(0.0)).max(0.0);
        *out.entry(class.clone())
            .or_default()
            .entry(result.clone())
            .or_default() += v;
    }
    out
}

impl PageSummary {
    /// The summary of reading `r`, taken at `at` (`unix_ms` for display), with the sampler's ring.
    pub fn compute(r: &Reading, history: &History, at: Instant, unix_ms: u64) -> PageSummary {
        let base = history.base_for(at);
        let start_ms = r.start_time.map_or(0, |s| (s * 1000.0) as u64);
        let from_unix_ms = base.map_or(start_ms, |b| b.unix_ms);
        let empty = Hist::default();
        let ttft = r.ttft.since(base.map_or(&empty, |b| &b.ttft));
        let tps = r.request_tps.since(base.map_or(&empty, |b| &b.request_tps));
        let part = |name: &str| {
            r.ttft_parts
                .get(name)
                .map(|p| p.since(base.and_then(|b| b.ttft_parts.get(name))))
                .unwrap_or_default()
        };
        let split = part("other").count;
        let ttft_parts = if split > 0.0 {
            ["queue", "model_load", "prefill", "other"]
                .into_iter()
                .map(|name| (name, part(name)))
                .filter(|(_, p): &(&str, PartSum)| p.count > 0.0)
                .map(|(name, p)| TtftPart {
                    part: name.to_string(),
                    requests: p.count,
                    mean_seconds: p.sum / split,
                })
                .collect()
        } else {
            Vec::new()
        };
        let now = Now {
            in_flight_prefill: r.in_flight_prefill,
            in_flight_decode: r.in_flight_decode,
            output_tokens_per_second: r.output_tps,
            output_tokens_per_second_per_gpu: r.output_tps_per_gpu,
            gpus: r.gpus,
            window: Window {
                from_unix_ms,
                seconds: unix_ms.saturating_sub(from_unix_ms) as f64 / 1000.0,
            },
            ttft_requests: ttft.count,
            ttft_p50_seconds: ttft.quantile(0.5),
            ttft_p99_seconds: ttft.quantile(0.99),
            request_tps_requests: tps.count,
            request_tokens_per_second_p50: tps.quantile(0.5),
            ttft_split_requests: split,
            ttft_parts,
        };
        // The section exists once classes are exported: counted, or declared with an objective.
        let declared = (r.slo.is_some() || !r.slo_objective.is_empty()).then_some(());
        let no_counts = BTreeMap::new();
        let slo = declared.map(|()| {
            let slo = r.slo.as_ref().unwrap_or(&no_counts);
            let mut window = per_class(slo, base.map(|b| &b.slo));
            let mut since = per_class(slo, None);
            // A declared class (it has an objective) shows before its first request.
            for class in r.slo_objective.keys() {
                window.entry(class.clone()).or_default();
            }
            window
                .into_iter()
                .map(|(class, results)| SloClass {
                    objective: r.slo_objective.get(&class).copied(),
                    since_start: attainment(since.remove(&class).unwrap_or_default()),
                    window: attainment(results),
                    class,
                })
                .collect()
        });
        let mut names: Vec<&str> = r.request_tps_by_band.keys().map(String::as_str).collect();
        names.extend(history.bands().keys().copied());
        names.sort_by(|a, b| band_bounds(a).0.total_cmp(&band_bounds(b).0));
        names.dedup();
        let bands = names
            .into_iter()
            .map(|band| {
                let (lo, hi) = band_bounds(band);
                let h = r.request_tps_by_band.get(band);
                let acc = history.bands().get(band).copied().unwrap_or_default();
                let n = acc.samples as f64;
                Band {
                    band: band.to_string(),
                    concurrency: (lo.max(1.0) * hi.max(1.0)).sqrt(),
                    requests: h.map_or(0.0, |h| h.count),
                    per_request_p50: h.and_then(|h| h.quantile(0.5)),
                    per_request_p90: h.and_then(|h| h.quantile(0.9)),
                    aggregate_samples: acc.samples,
                    aggregate_tokens_per_second: (acc.samples > 0)
                        .then(|| acc.tokens_per_second_sum / n),
                    aggregate_mean_in_flight: (acc.samples > 0).then(|| acc.in_flight_sum / n),
                }
            })
            .collect();
        PageSummary {
            version: r.version.clone(),
            generated_unix_ms: unix_ms,
            sample_period_seconds: history.period().as_secs_f64(),
            history_span_seconds: super::history::HISTORY_SPAN.as_secs_f64(),
            now,
            slo,
            tradeoff: Tradeoff {
                bands,
                capacity_curve: r.capacity_curve.clone(),
                max_concurrency: r.capacity_max_concurrency.clone(),
                limits: r.capacity_limits.clone(),
                workload: r.capacity_workload.clone(),
                check: r.capacity_check.clone(),
                unsupported: r
                    .capacity_unsupported
                    .as_deref()
                    .map(crate::metrics::capacity::unsupported_in_words),
                floors: r
                    .capacity_tps_floor
                    .iter()
                    .map(|(class, &v)| Floor {
                        class: class.clone(),
                        tokens_per_second: v,
                    })
                    .collect(),
            },
            history: history.points().cloned().collect(),
            outcomes: counts(&r.outcomes),
            codes: counts(&r.codes),
            token_sources: counts(&r.token_sources),
            totals: Totals {
                requests: r.requests,
                output_tokens: r.output_tokens,
                input_tokens: r.input_tokens,
            },
            gpu_time: GpuTime {
                by_tenant: r
                    .gpu_by_tenant
                    .iter()
                    .map(|(k, &v)| GpuShare {
                        name: k.clone(),
                        gpu_seconds: v,
                    })
                    .collect(),
                idle_seconds: r.gpu_idle,
                unassigned_seconds: r.gpu_unassigned,
            },
            workload_log: (!r.workload_log.is_empty()).then(|| {
                let n = |k: &str| r.workload_log.get(k).copied().unwrap_or(0.0);
                WorkloadLog {
                    written: n("written"),
                    dropped: n("dropped"),
                    skipped: n("skipped"),
                }
            }),
        }
    }
}

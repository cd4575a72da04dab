//! The capacity model's metric families (their names are in [`super::names::capacity`]).
//!
//! They are gauges refreshed from a [`Report`] when `/metrics` is rendered (a refit is at most
//! every few seconds), never per chunk. Series that need a fit are absent until there is one, and
//! a class's series are absent when the class has no speed floor, so a dashboard shows "no data"
//! rather than a made-up zero. Label values: the configured class names (a closed list), the
//! curve's nine concurrencies, and closed enums.

use prometheus::{Gauge, GaugeVec, Opts};

use super::registrar::Registrar;

use crate::capacity::arrivals::Shape;
use crate::capacity::plan::CURVE;
use crate::capacity::support::Unsupported;
use crate::capacity::{Bound, ClassTargets, Report};

use super::names::capacity as names;

/// A `reason` of [`names::UNSUPPORTED`] in words, for the readers of an exposition (the page,
/// `tokenmeter capacity`).
pub fn unsupported_in_words(reason: &str) -> String {
    crate::capacity::support::in_words(reason)
}

/// The `source` label of [`names::CHECK_TTFT`] and [`names::CHECK_TPS`].
pub const CHECK_SOURCES: [&str; 2] = ["predicted", "observed"];
/// The `quantity` label of [`names::CHECK_ERROR`].
pub const CHECK_QUANTITIES: [&str; 2] = ["ttft", "tokens_per_second"];

/// The `bound` label of [`names::LIMIT_CONCURRENCY`].
pub const LIMIT_BOUNDS: [Bound; 4] = Bound::ALL;
/// The `percentile` label of [`names::TTFT_SECONDS`]: `capacity::limits::QUANTILES` in
/// hundredths. Not `quantile`: the family is a gauge, and `quantile` is the label a summary
/// owns (`promtool check metrics` refuses it on any other type).
pub const PERCENTILE_LABELS: [&str; 3] = ["50", "90", "99"];
/// The `kind` label of [`names::WORKLOAD_TOKENS`].
pub const WORKLOAD_KINDS: [&str; 3] = ["prompt", "cached", "output"];

/// The `term` label of [`names::STEP_SECONDS`].
pub const TERMS: [&str; 2] = ["base", "per_sequence"];
/// The `bound` label of [`names::OBSERVED_CONCURRENCY`].
pub const BOUNDS: [&str; 2] = ["min", "max"];
/// The `kind` label of [`names::CURVE_TPS`].
pub const KINDS: [&str; 2] = ["per_request", "aggregate"];

/// The capacity families, registered in a given registry.
pub struct CapacityMetrics {
    step: GaugeVec,
    samples: Gauge,
    r2: GaugeVec,
    observed: GaugeVec,
    max_concurrency: GaugeVec,
    output_tps: GaugeVec,
    output_tps_per_gpu: GaugeVec,
    cost: GaugeVec,
    curve: GaugeVec,
    utilization: GaugeVec,
    replicas: Gauge,
    limit: GaugeVec,
    rate: GaugeVec,
    ttft: GaugeVec,
    prefill: GaugeVec,
    workload: GaugeVec,
    workload_requests: Gauge,
    in_flight: Gauge,
    kv_cache_tokens: GaugeVec,
    kv_per_request: GaugeVec,
    check_concurrency: GaugeVec,
    check_ttft: GaugeVec,
    check_tps: GaugeVec,
    check_error: GaugeVec,
    check_trusted: GaugeVec,
    wire: GaugeVec,
    supported: GaugeVec,
    unsupported: GaugeVec,
    arrivals: GaugeVec,
    /// Every class name a series may carry, and whether it has a target the model answers for
    /// (a speed floor or a TTFT target).
    classes: Vec<(String, bool)>,
}

fn vec(r: &Registrar, name: &str, help: &str, labels: &[&str]) -> prometheus::Result<GaugeVec> {
    let g = GaugeVec::new(Opts::new(name, help), labels)?;
    r.register(&g)?;
    Ok(g)
}

impl CapacityMetrics {
    /// Registers every family into `r`. `classes` are all the classes that can be reported.
    pub(super) fn register(r: &Registrar, classes: &[ClassTargets]) -> prometheus::Result<Self> {
        use names::*;
        let samples = Gauge::with_opts(Opts::new(
            FIT_SAMPLES,
            "Token samples in the capacity window at the concurrencies the fit can use.",
        ))?;
        r.register(&samples)?;
        let replicas = Gauge::with_opts(Opts::new(
            REPLICAS,
            "Inference engines the decoding concurrency is divided by (--replicas, or what auto found).",
        ))?;
        r.register(&replicas)?;
        let workload_requests = Gauge::with_opts(Opts::new(
            WORKLOAD_REQUESTS,
            "Requests in the capacity window's mix that the first-token predictions replay.",
        ))?;
        r.register(&workload_requests)?;
        let in_flight = Gauge::with_opts(Opts::new(
            IN_FLIGHT,
            "Mean requests in flight per engine over the last minute (decoding or waiting for the first token).",
        ))?;
        r.register(&in_flight)?;
        // The floors and TTFT targets are the classes' own: constant, set once, so a chart can
        // draw them beside the curve, and a replay judge by them, without the configuration.
        let floor = vec(
            r,
            TPS_FLOOR,
            "Per-request tokens/s floor of the SLO class the capacity answers are for.",
            &["class"],
        )?;
        let ttft_target = vec(
            r,
            TTFT_TARGET,
            "Longest TTFT of the SLO class the capacity answers are for, in seconds.",
            &["class"],
        )?;
        for c in classes {
            if let Some(f) = c.tps_floor {
                floor.with_label_values(&[&c.name]).set(f);
            }
            if let Some(t) = c.ttft {
                ttft_target.with_label_values(&[&c.name]).set(t);
            }
        }
        Ok(CapacityMetrics {
            step: vec(
                r,
                STEP_SECONDS,
                "Fitted decode step cost t(b) = base + per_sequence * b, in seconds.",
                &["term"],
            )?,
            samples,
            r2: vec(
                r,
                FIT_R2,
                "Coefficient of determination of the capacity fit over the per-concurrency medians.",
                &[],
            )?,
            observed: vec(
                r,
                OBSERVED_CONCURRENCY,
                "Lowest and highest decoding concurrency per engine in the fit; answers outside are extrapolations.",
                &["bound"],
            )?,
            max_concurrency: vec(
                r,
                MAX_CONCURRENCY,
                "Requests in flight per engine the class holds: the smaller of its two limits.",
                &["class"],
            )?,
            output_tps: vec(
                r,
                OUTPUT_TPS,
                "Aggregate output tokens/s of all replicas, each at the class's max concurrency.",
                &["class"],
            )?,
            output_tps_per_gpu: vec(
                r,
                OUTPUT_TPS_PER_GPU,
                "tokenmeter_capacity_output_tokens_per_second / GPUs.",
                &["class"],
            )?,
            cost: vec(
                r,
                COST_PER_MILLION,
                "GPU cost of a million output tokens at the class's max concurrency (--gpu-hour-cost).",
                &["class"],
            )?,
            curve: vec(
                r,
                CURVE_TPS,
                "Predicted tokens/s per engine at a concurrency: per request (1/t(b)) and aggregate (b/t(b)).",
                &["concurrency", "kind"],
            )?,
            utilization: vec(
                r,
                UTILIZATION,
                "Mean requests in flight per engine over the last minute / the class's max concurrency.",
                &["class"],
            )?,
            replicas,
            limit: vec(
                r,
                LIMIT_CONCURRENCY,
                "Requests in flight per engine at which the class's TTFT target or tokens/s floor still holds.",
                &["class", "bound"],
            )?,
            rate: vec(
                r,
                MAX_REQUEST_RATE,
                "Poisson arrivals per second per engine at which the class's targets still hold.",
                &["class"],
            )?,
            ttft: vec(
                r,
                TTFT_SECONDS,
                "Predicted TTFT per engine at a concurrency of clients over the window's mix, in seconds.",
                &["concurrency", "percentile"],
            )?,
            prefill: vec(
                r,
                PREFILL_PER_TOKEN,
                "Fitted prefill cost per uncached prompt token, in seconds; source: stated, wire or none.",
                &["source"],
            )?,
            workload: vec(
                r,
                WORKLOAD_TOKENS,
                "Mean tokens per request of the mix the first-token predictions assume, by kind.",
                &["kind"],
            )?,
            workload_requests,
            in_flight,
            kv_cache_tokens: vec(
                r,
                KV_CACHE_TOKENS,
                "The engine's KV cache in tokens as the model takes it (--kv-cache-tokens, else the engine's metrics); absent when not known.",
                &[],
            )?,
            kv_per_request: vec(
                r,
                KV_TOKENS_PER_REQUEST,
                "KV cache tokens (whole blocks) one closed-loop client of the mix holds on average over its requests' lives; absent while the cache's size is not known.",
                &[],
            )?,
            check_concurrency: vec(
                r,
                CHECK_CONCURRENCY,
                "Requests in flight per engine (the last minute's mean, rounded) at which the model is checked against what was measured.",
                &[],
            )?,
            check_ttft: vec(
                r,
                CHECK_TTFT,
                "TTFT p90 at the checked concurrency: the model's prediction and the last minute's requests', seconds.",
                &["source"],
            )?,
            check_tps: vec(
                r,
                CHECK_TPS,
                "Median per-request decode tokens/s at the checked concurrency: predicted and observed.",
                &["source"],
            )?,
            check_error: vec(
                r,
                CHECK_ERROR,
                "The model's error at the checked concurrency: predicted / observed - 1.",
                &["quantity"],
            )?,
            check_trusted: vec(
                r,
                CHECK_TRUSTED,
                "1 when every checked error is within 50%, 0 when the capacity answer is not to be trusted.",
                &[],
            )?,
            wire: vec(
                r,
                KV_WIRE_TOKENS,
                "KV-cache tokens the requests in flight hold per engine by the wire's count: the output tokens they have streamed, plus for each the mean uncached prompt of the capacity window's mix; absent until there is a mix.",
                &[],
            )?,
            supported: vec(
                r,
                SUPPORTED,
                "1 when the class's capacity answer is exported, 0 when the model cannot answer yet (tokenmeter_capacity_unsupported says why): max_concurrency and utilization are then absent.",
                &["class"],
            )?,
            unsupported: vec(
                r,
                UNSUPPORTED,
                "1 for the reason the capacity model cannot answer yet: warming_up, narrow_spread (one steady level) or no_slowdown; absent while it answers.",
                &["reason"],
            )?,
            arrivals: vec(
                r,
                ARRIVALS,
                "1 for how the capacity window's requests arrived, the shape the limits replay: closed_in_step, closed or open.",
                &["shape"],
            )?,
            classes: classes
                .iter()
                .map(|c| (c.name.clone(), c.tps_floor.is_some() || c.ttft.is_some()))
                .collect(),
        })
    }

    /// Sets the wire's view of the KV cache (`Capacity::wire_tokens`).
    pub fn update_wire(&self, tokens: Option<f64>) {
        match tokens {
            Some(t) => self.wire.with_label_values::<&str>(&[]).set(t),
            None => {
                let _ = self.wire.remove_label_values::<&str>(&[]);
            }
        }
    }

    /// Sets every series from `report`; removes those it has no value for.
    pub fn update(&self, report: &Report) {
        self.samples.set(report.samples as f64);
        self.replicas.set(f64::from(report.replicas));
        let set = |g: &GaugeVec, labels: &[&str], v: Option<f64>| match v {
            Some(v) => g.with_label_values(labels).set(v),
            None => {
                let _ = g.remove_label_values(labels);
            }
        };
        let c = report.check.as_ref();
        set(
            &self.check_concurrency,
            &[],
            c.map(|c| f64::from(c.concurrency)),
        );
        let tps = c.and_then(|c| c.tps);
        for (i, source) in CHECK_SOURCES.iter().enumerate() {
            let pick = |p: crate::capacity::check::Pair| [p.predicted, p.observed][i];
            set(&self.check_ttft, &[source], c.map(|c| pick(c.ttft)));
            set(&self.check_tps, &[source], tps.map(pick));
        }
        set(
            &self.check_error,
            &[CHECK_QUANTITIES[0]],
            c.and_then(|c| c.ttft.error()),
        );
        set(
            &self.check_error,
            &[CHECK_QUANTITIES[1]],
            tps.and_then(|p| p.error()),
        );
        set(
            &self.check_trusted,
            &[],
            c.map(|c| if c.trusted() { 1.0 } else { 0.0 }),
        );
        let m = &report.memory;
        set(
            &self.kv_cache_tokens,
            &[],
            m.kv_cache_tokens.map(|t| t as f64),
        );
        set(
            &self.kv_per_request,
            &[],
            report
                .kv_blocks_per_request
                .filter(|_| m.kv_cache_tokens.is_some())
                .map(|b| b * f64::from(m.block_size)),
        );
        let fit = report.fit.as_ref();
        set(&self.step, &[TERMS[0]], fit.map(|f| f.base));
        set(&self.step, &[TERMS[1]], fit.map(|f| f.per_seq));
        set(&self.r2, &[], fit.map(|f| f.r2));
        let (lo, hi) = report.observed.unzip();
        set(&self.observed, &[BOUNDS[0]], lo.map(f64::from));
        set(&self.observed, &[BOUNDS[1]], hi.map(f64::from));
        for b in CURVE {
            let point = report.curve.iter().find(|p| p.concurrency == b);
            let c = b.to_string();
            set(&self.curve, &[&c, KINDS[0]], point.map(|p| p.per_request));
            set(&self.curve, &[&c, KINDS[1]], point.map(|p| p.aggregate));
        }
        self.in_flight.set(report.in_flight);
        self.workload_requests
            .set(report.mix.map_or(0.0, |m| m.requests as f64));
        let mix = report.mix.map(|m| [m.prompt, m.cached, m.output]);
        for (i, kind) in WORKLOAD_KINDS.iter().enumerate() {
            set(&self.workload, &[kind], mix.map(|m| m[i]));
        }
        for source in ["stated", "wire", "none"] {
            let p = report.prefill.filter(|p| p.source.as_str() == source);
            set(&self.prefill, &[source], p.map(|p| p.per_token));
        }
        for b in CURVE {
            let point = report.ttft_curve.iter().find(|p| p.concurrency == b);
            let c = b.to_string();
            for (i, p) in PERCENTILE_LABELS.iter().enumerate() {
                set(&self.ttft, &[&c, p], point.map(|t| t.quantiles[i]));
            }
        }
        for reason in Unsupported::ALL {
            let on = report.unsupported == Some(reason);
            set(&self.unsupported, &[reason.as_str()], on.then_some(1.0));
        }
        for shape in [Shape::InStep, Shape::Joining, Shape::Open] {
            let on = report.shape == Some(shape);
            set(&self.arrivals, &[shape.as_str()], on.then_some(1.0));
        }
        for (class, answerable) in &self.classes {
            let a = report.answers.iter().find(|a| &a.class == class);
            let l = [class.as_str()];
            let supported = match (a, report.unsupported) {
                (Some(_), _) => Some(1.0),
                (None, _) if *answerable => Some(0.0),
                _ => None,
            };
            set(&self.supported, &l, supported);
            for bound in LIMIT_BOUNDS {
                let v = a.and_then(|a| match bound {
                    Bound::Ttft => a.limit_ttft,
                    Bound::TokensPerSecond => a.limit_tps,
                    Bound::KvCache => a.limit_kv,
                    Bound::MaxNumSeqs => a.limit_seqs,
                });
                set(&self.limit, &[class, bound.as_str()], v.map(f64::from));
            }
            set(&self.rate, &l, a.and_then(|a| a.max_request_rate));
            set(
                &self.max_concurrency,
                &l,
                a.map(|a| f64::from(a.max_concurrency)),
            );
            set(&self.output_tps, &l, a.map(|a| a.output_tps));
            set(
                &self.output_tps_per_gpu,
                &l,
                a.map(|a| a.output_tps_per_gpu),
            );
            set(&self.cost, &l, a.and_then(|a| a.cost_per_million));
            set(&self.utilization, &l, a.and_then(|a| a.utilization));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use prometheus::{Encoder, TextEncoder};

    use super::*;
    use crate::capacity::{Capacity, Fleet, Inputs};

    fn render(r: &Registrar) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&r.gather(), &mut out)
            .expect("encode");
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn series_appear_with_the_fit_and_carry_the_issues_names() {
        let classes = vec![
            ClassTargets {
                ttft: Some(2.5),
                ..ClassTargets::floor("interactive", 40.0)
            },
            ClassTargets {
                tps_floor: None,
                ..ClassTargets::floor("batch", 1.0)
            },
        ];
        let r = Registrar::new();
        let m = CapacityMetrics::register(&r, &classes).expect("register");
        let t0 = Instant::now();
        let cap = Capacity::new(
            Inputs {
                classes,
                fleet: Fleet {
                    replicas: 1,
                    gpus: 1.0,
                    gpu_hour_cost: Some(3.6),
                },
                ..Inputs::default()
            },
            t0,
        );
        m.update(&cap.refit(t0));
        let text = render(&r);
        assert!(text.contains("tokenmeter_capacity_fit_samples 0"), "{text}");
        assert!(
            !text.contains("tokenmeter_capacity_step_seconds{"),
            "{text}"
        );
        assert!(!text.contains("tokenmeter_capacity_fit_r2 "), "{text}");
        // Warming up: the class is unsupported, and says why; its answer is absent.
        for want in [
            "tokenmeter_capacity_supported{class=\"interactive\"} 0",
            "tokenmeter_capacity_unsupported{reason=\"warming_up\"} 1",
        ] {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
        assert!(
            !text.contains("tokenmeter_capacity_max_concurrency{"),
            "{text}"
        );
        assert!(!text.contains("tokenmeter_capacity_utilization{"), "{text}");

        for b in 1..=40u32 {
            let step = Duration::from_micros(10_000 + 500 * u64::from(b));
            for _ in 0..25 {
                cap.push(f64::from(b), step, 1, t0 + Duration::from_secs(1));
            }
        }
        m.update(&cap.refit(t0 + Duration::from_secs(2)));
        let text = render(&r);
        for want in [
            "tokenmeter_capacity_step_seconds{term=\"base\"} 0.01",
            "tokenmeter_capacity_step_seconds{term=\"per_sequence\"} 0.000",
            "tokenmeter_capacity_fit_samples 1000",
            "tokenmeter_capacity_fit_r2 0.9",
            "tokenmeter_capacity_observed_concurrency{bound=\"min\"} 1",
            "tokenmeter_capacity_observed_concurrency{bound=\"max\"} 40",
            "tokenmeter_capacity_max_concurrency{class=\"interactive\"} ",
            "tokenmeter_capacity_output_tokens_per_second{class=\"interactive\"} ",
            "tokenmeter_capacity_output_tokens_per_second_per_gpu{class=\"interactive\"} ",
            "tokenmeter_capacity_cost_per_million_output_tokens{class=\"interactive\"} ",
            "tokenmeter_capacity_curve_tokens_per_second{concurrency=\"256\",kind=\"aggregate\"} ",
            "tokenmeter_capacity_curve_tokens_per_second{concurrency=\"1\",kind=\"per_request\"} ",
            "tokenmeter_capacity_utilization{class=\"interactive\"} ",
            "tokenmeter_capacity_tps_floor{class=\"interactive\"} 40",
            "tokenmeter_capacity_ttft_target_seconds{class=\"interactive\"} 2.5",
            "tokenmeter_capacity_replicas 1",
            "tokenmeter_capacity_supported{class=\"interactive\"} 1",
        ] {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
        assert!(!text.contains("tokenmeter_capacity_unsupported{"), "{text}");
        // A class without a floor has no capacity answer.
        assert!(!text.contains("class=\"batch\""), "{text}");
        assert_eq!(
            text.matches("tokenmeter_capacity_curve_tokens_per_second{")
                .count(),
            18
        );
    }

    #[test]
    fn ttft_percentile_labels_are_the_curves_quantiles_in_hundredths() {
        use crate::capacity::limits::QUANTILES;
        let hundredths: Vec<String> = QUANTILES
            .iter()
            .map(|q| format!("{}", (q * 100.0).round()))
            .collect();
        assert_eq!(hundredths, PERCENTILE_LABELS);

        // A gauge with a `quantile` label is what `promtool check metrics` refuses.
        let r = Registrar::new();
        let m = CapacityMetrics::register(&r, &[]).expect("register");
        let cap = Capacity::new(Inputs::default(), Instant::now());
        let mut report = cap.refit(Instant::now());
        report.ttft_curve = vec![crate::capacity::TtftPoint {
            concurrency: 4,
            quantiles: [0.25, 0.5, 0.75],
        }];
        m.update(&report);
        let text = render(&r);
        for want in [
            "tokenmeter_capacity_ttft_seconds{concurrency=\"4\",percentile=\"50\"} 0.25",
            "tokenmeter_capacity_ttft_seconds{concurrency=\"4\",percentile=\"90\"} 0.5",
            "tokenmeter_capacity_ttft_seconds{concurrency=\"4\",percentile=\"99\"} 0.75",
        ] {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
        assert!(!text.contains("quantile="), "{text}");
    }
}

//! The summary over a registry with known observations: exact figures by the stated
//! interpolation, windows, and the optional SLO and capacity sections.

#![allow(clippy::unwrap_used)] // a test that unwraps fails loudly, which is its job

use std::time::{Duration, Instant};

use prometheus::{
    CounterVec, Gauge, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry,
};

use super::reading::*;
use super::*;

/// A registry with tokenmeter's family names and a few known observations.
struct Fixture {
    registry: Registry,
    ttft: HistogramVec,
    tps: HistogramVec,
    slo: Option<IntCounterVec>,
}

fn hist(r: &Registry, name: &str, labels: &[&str], buckets: &[f64]) -> HistogramVec {
    let h = HistogramVec::new(
        HistogramOpts::new(name, "h").buckets(buckets.to_vec()),
        labels,
    )
    .unwrap();
    r.register(Box::new(h.clone())).unwrap();
    h
}

impl Fixture {
    fn new() -> Fixture {
        let r = Registry::new();
        let ttft = hist(&r, TTFT, &["model"], &[0.1, 0.5, 1.0]);
        let tps = hist(
            &r,
            REQUEST_TPS,
            &["model", "concurrency"],
            &[10.0, 20.0, 50.0, 100.0],
        );
        let g = |name: &str, v: f64| {
            let g = Gauge::new(name, "g").unwrap();
            g.set(v);
            r.register(Box::new(g)).unwrap();
        };
        g(OUTPUT_TPS, 1234.0);
        g(OUTPUT_TPS_PER_GPU, 617.0);
        g(GPUS, 2.0);
        g(START_TIME, 1_000.0);
        let in_flight = GaugeVec::new(Opts::new(IN_FLIGHT, "g"), &["phase"]).unwrap();
        in_flight.with_label_values(&["prefill"]).set(2.0);
        in_flight.with_label_values(&["decode"]).set(5.0);
        r.register(Box::new(in_flight)).unwrap();
        let requests =
            IntCounterVec::new(Opts::new(REQUESTS, "c"), &["model", "code", "outcome"]).unwrap();
        requests
            .with_label_values(&["a", "200", "complete"])
            .inc_by(3);
        requests
            .with_label_values(&["b", "502", "upstream_error"])
            .inc();
        r.register(Box::new(requests)).unwrap();
        let sources = IntCounterVec::new(Opts::new(TOKEN_SOURCE, "c"), &["source"]).unwrap();
        sources.with_label_values(&["usage"]).inc_by(3);
        sources.with_label_values(&["counted"]).inc();
        r.register(Box::new(sources)).unwrap();
        let gpu = CounterVec::new(
            Opts::new(crate::metrics::names::cost::GPU_SECONDS, "c"),
            &["model", "phase", "tenant"],
        )
        .unwrap();
        gpu.with_label_values(&["a", "prefill", "team-a"])
            .inc_by(1.5);
        gpu.with_label_values(&["a", "decode", "team-a"])
            .inc_by(2.0);
        gpu.with_label_values(&["b", "decode", "team-b"])
            .inc_by(0.5);
        r.register(Box::new(gpu)).unwrap();
        g(crate::metrics::names::cost::GPU_IDLE_SECONDS, 6.0);
        g(crate::metrics::names::cost::GPU_UNASSIGNED_SECONDS, 0.25);
        Fixture {
            registry: r,
            ttft,
            tps,
            slo: None,
        }
    }

    fn observe_first_batch(&self) {
        for (m, x) in [
            ("a", 0.05),
            ("a", 0.2),
            ("a", 0.3),
            ("a", 0.4),
            ("a", 0.7),
            ("b", 0.9),
        ] {
            self.ttft.with_label_values(&[m]).observe(x);
        }
        for (band, x) in [
            ("1", 80.0),
            ("1", 90.0),
            ("5-8", 15.0),
            ("5-8", 18.0),
            ("5-8", 30.0),
        ] {
            self.tps.with_label_values(&["a", band]).observe(x);
        }
    }

    fn with_slo(mut self) -> Fixture {
        let slo = IntCounterVec::new(
            Opts::new(SLO_REQUESTS, "c"),
            &["class", "model", "concurrency", "result"],
        )
        .unwrap();
        self.registry.register(Box::new(slo.clone())).unwrap();
        let objective = GaugeVec::new(Opts::new(SLO_OBJECTIVE, "g"), &["class"]).unwrap();
        objective.with_label_values(&["interactive"]).set(0.95);
        objective.with_label_values(&["agent"]).set(0.9);
        self.registry.register(Box::new(objective)).unwrap();
        self.slo = Some(slo);
        self
    }

    fn reading(&self) -> Reading {
        Reading::from_families(&self.registry.gather())
    }
}

const PERIOD: Duration = Duration::from_secs(5);
const WINDOW: Duration = Duration::from_secs(10);

fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-9)
}

#[test]
fn now_figures_are_the_buckets_read_as_histogram_quantile_does() {
    let f = Fixture::new();
    f.observe_first_batch();
    let h = History::new(PERIOD, WINDOW);
    let s = PageSummary::compute(&f.reading(), &h, Instant::now(), 1_030_000);
    let n = &s.now;
    assert_eq!((n.in_flight_prefill, n.in_flight_decode), (2.0, 5.0));
    assert_eq!(n.output_tokens_per_second, 1234.0);
    assert_eq!((n.output_tokens_per_second_per_gpu, n.gpus), (617.0, 2.0));
    // No reading a minute old yet: the window runs from the process start.
    assert_eq!(n.window.from_unix_ms, 1_000_000);
    assert_eq!(n.window.seconds, 30.0);
    // TTFT: 1 <= 0.1 < 3 more <= 0.5 < 2 more <= 1. Rank 3 of 6 is 2/3 into (0.1, 0.5].
    assert_eq!(n.ttft_requests, 6.0);
    assert!(close(n.ttft_p50_seconds, 0.1 + 0.4 * 2.0 / 3.0), "{n:?}");
    // Rank 5.94 is 1.94/2 into (0.5, 1].
    assert!(close(n.ttft_p99_seconds, 0.5 + 0.5 * 1.94 / 2.0), "{n:?}");
    // Per request, all bands: 15, 18 | 30 | 80, 90. Rank 2.5 is half way into (20, 50].
    assert!(close(n.request_tokens_per_second_p50, 35.0), "{n:?}");
    let bands: Vec<_> = s.tradeoff.bands.iter().map(|b| b.band.as_str()).collect();
    assert_eq!(bands, ["1", "5-8"]);
    let b1 = &s.tradeoff.bands[0];
    assert!(close(b1.per_request_p50, 75.0) && b1.requests == 2.0 && b1.concurrency == 1.0);
    let b5 = &s.tradeoff.bands[1];
    assert!(close(b5.per_request_p50, 17.5), "{b5:?}");
    assert!((b5.concurrency - 40f64.sqrt()).abs() < 1e-12);
    // No sample taken: no aggregate by band yet.
    assert_eq!(b5.aggregate_tokens_per_second, None);
    assert_eq!(s.totals.requests, 4.0);
    let outcomes: Vec<_> = s
        .outcomes
        .iter()
        .map(|c| (c.name.as_str(), c.requests))
        .collect();
    assert_eq!(outcomes, [("complete", 3.0), ("upstream_error", 1.0)]);
    let sources: Vec<_> = s
        .token_sources
        .iter()
        .map(|c| (c.name.as_str(), c.requests))
        .collect();
    assert_eq!(sources, [("counted", 1.0), ("usage", 3.0)]);
    // GPU-seconds by tenant, both phases and models summed; idle and in flight beside them.
    let gpu: Vec<_> = s
        .gpu_time
        .by_tenant
        .iter()
        .map(|g| (g.name.as_str(), g.gpu_seconds))
        .collect();
    assert_eq!(gpu, [("team-a", 3.5), ("team-b", 0.5)]);
    assert_eq!(
        (s.gpu_time.idle_seconds, s.gpu_time.unassigned_seconds),
        (6.0, 0.25)
    );
    assert_eq!(s.slo, None);
    assert!(s.tradeoff.capacity_curve.is_empty());
    assert!(s.tradeoff.floors.is_empty() && s.tradeoff.max_concurrency.is_empty());
}

#[test]
fn percentiles_cover_the_last_minute_once_the_ring_reaches_back_that_far() {
    let f = Fixture::new();
    f.observe_first_batch();
    let mut h = History::new(PERIOD, WINDOW);
    let t0 = Instant::now();
    h.record(&f.reading(), t0, 1_000_000);
    // A second reading once the gauge's window is covered: 7 in flight throughout.
    h.record(&f.reading(), t0 + WINDOW, 1_010_000);
    // A minute and more later, four slow first tokens: only they count now.
    for x in [0.6, 0.7, 0.8, 0.9] {
        f.ttft.with_label_values(&["c"]).observe(x);
    }
    let s = PageSummary::compute(&f.reading(), &h, t0 + Duration::from_secs(61), 1_061_000);
    assert_eq!(s.now.window.from_unix_ms, 1_000_000);
    assert_eq!(s.now.ttft_requests, 4.0);
    // All four in (0.5, 1]: rank 2 of 4 is half way.
    assert!(close(s.now.ttft_p50_seconds, 0.75), "{:?}", s.now);
    // Nothing per request in the window.
    assert_eq!(s.now.request_tokens_per_second_p50, None);
    // The band chart is since start, and the one covered reading (7 in flight) is band 5-8.
    let b5 = s.tradeoff.bands.iter().find(|b| b.band == "5-8").unwrap();
    assert_eq!(b5.aggregate_samples, 1);
    assert_eq!(b5.aggregate_tokens_per_second, Some(1234.0));
    assert_eq!(b5.aggregate_mean_in_flight, Some(7.0));
    assert!(close(b5.per_request_p50, 17.5));
    assert_eq!(s.history.len(), 2);
    assert!(close(s.history[0].ttft_p50_seconds, 0.1 + 0.4 * 2.0 / 3.0));
    assert_eq!(s.history[1].ttft_p50_seconds, None);
}

#[test]
fn slo_attainment_leaves_out_abandoned_requests_and_appears_only_with_the_series() {
    let f = Fixture::new().with_slo();
    let slo = f.slo.clone().unwrap();
    let mut h = History::new(PERIOD, WINDOW);
    let t0 = Instant::now();
    slo.with_label_values(&["interactive", "a", "1", "met"])
        .inc_by(10);
    h.record(&f.reading(), t0, 1_000_000);
    for (result, n) in [
        ("met", 6),
        ("ttft_missed", 1),
        ("tps_missed", 1),
        ("client_disconnect", 2),
    ] {
        slo.with_label_values(&["interactive", "a", "2-4", result])
            .inc_by(n);
    }
    slo.with_label_values(&["batch", "a", "1", "error"]).inc();
    let s = PageSummary::compute(&f.reading(), &h, t0 + Duration::from_secs(60), 1_060_000);
    let classes = s.slo.unwrap();
    let names: Vec<_> = classes.iter().map(|c| c.class.as_str()).collect();
    // "agent" is declared (it has an objective) but has no request yet.
    assert_eq!(names, ["agent", "batch", "interactive"]);
    assert_eq!(classes[0].window.requests, 0.0);
    assert_eq!(classes[0].window.attainment, None);
    assert_eq!(classes[0].objective, Some(0.9));
    let classes = &classes[1..];
    let i = &classes[1];
    assert_eq!(i.objective, Some(0.95));
    // The window: 6 met of 10, 2 abandoned: 6 / 8.
    assert_eq!((i.window.requests, i.window.met), (10.0, 6.0));
    assert_eq!(i.window.attainment, Some(0.75));
    assert_eq!(i.window.results["ttft_missed"], 1.0);
    // Since start: 16 met of 20, 2 abandoned: 16 / 18.
    assert_eq!(i.since_start.attainment, Some(16.0 / 18.0));
    assert_eq!(classes[0].window.attainment, Some(0.0));
    assert_eq!(classes[0].objective, None);
}

#[test]
fn the_capacity_curve_is_read_when_it_is_exported() {
    let f = Fixture::new();
    let curve = GaugeVec::new(Opts::new(CAPACITY_CURVE, "g"), &["concurrency", "kind"]).unwrap();
    for (c, per, agg) in [("4", 80.0, 320.0), ("1", 95.0, 95.0), ("2", 90.0, 180.0)] {
        curve.with_label_values(&[c, "per_request"]).set(per);
        curve.with_label_values(&[c, "aggregate"]).set(agg);
    }
    f.registry.register(Box::new(curve)).unwrap();
    let max = GaugeVec::new(Opts::new(CAPACITY_MAX_CONCURRENCY, "g"), &["class"]).unwrap();
    max.with_label_values(&["interactive"]).set(30.0);
    f.registry.register(Box::new(max)).unwrap();
    let floor = GaugeVec::new(Opts::new(CAPACITY_TPS_FLOOR, "g"), &["class"]).unwrap();
    floor.with_label_values(&["interactive"]).set(40.0);
    f.registry.register(Box::new(floor)).unwrap();
    let limits = GaugeVec::new(
        Opts::new("tokenmeter_capacity_limit_concurrency", "g"),
        &["class", "bound"],
    )
    .unwrap();
    limits.with_label_values(&["interactive", "ttft"]).set(12.0);
    limits
        .with_label_values(&["interactive", "tokens_per_second"])
        .set(30.0);
    f.registry.register(Box::new(limits)).unwrap();
    let mix = GaugeVec::new(
        Opts::new("tokenmeter_capacity_workload_tokens", "g"),
        &["kind"],
    )
    .unwrap();
    mix.with_label_values(&["prompt"]).set(2000.0);
    mix.with_label_values(&["output"]).set(100.0);
    f.registry.register(Box::new(mix)).unwrap();
    let check = GaugeVec::new(
        Opts::new("tokenmeter_capacity_check_ttft_seconds", "g"),
        &["source"],
    )
    .unwrap();
    check.with_label_values(&["predicted"]).set(0.5);
    check.with_label_values(&["observed"]).set(1.5);
    f.registry.register(Box::new(check)).unwrap();
    let trusted = GaugeVec::new(Opts::new("tokenmeter_capacity_check_trusted", "g"), &[]).unwrap();
    trusted.with_label_values::<&str>(&[]).set(0.0);
    f.registry.register(Box::new(trusted)).unwrap();
    let s = PageSummary::compute(
        &f.reading(),
        &History::new(PERIOD, WINDOW),
        Instant::now(),
        0,
    );
    let per: Vec<_> = s.tradeoff.capacity_curve["per_request"]
        .iter()
        .map(|p| (p.concurrency, p.tokens_per_second))
        .collect();
    assert_eq!(per, [(1.0, 95.0), (2.0, 90.0), (4.0, 80.0)]);
    assert_eq!(
        s.tradeoff.capacity_curve["aggregate"][2].tokens_per_second,
        320.0
    );
    assert_eq!(s.tradeoff.max_concurrency["interactive"], 30.0);
    assert_eq!(s.tradeoff.floors.len(), 1);
    assert_eq!(s.tradeoff.floors[0].class, "interactive");
    assert_eq!(s.tradeoff.floors[0].tokens_per_second, 40.0);
    let l = &s.tradeoff.limits["interactive"];
    assert_eq!((l["ttft"], l["tokens_per_second"]), (12.0, 30.0));
    assert_eq!(
        (s.tradeoff.workload["prompt"], s.tradeoff.workload["output"]),
        (2000.0, 100.0)
    );
    assert!(!s.tradeoff.workload.contains_key("requests"));
    let k = &s.tradeoff.check;
    assert_eq!(
        (k["ttft_predicted"], k["ttft_observed"], k["trusted"]),
        (0.5, 1.5, 0.0)
    );
    assert!(!k.contains_key("concurrency"));
}

#[test]
fn the_page_and_its_data_are_served_with_a_strict_policy() {
    let f = Fixture::new();
    f.observe_first_batch();
    let ui = Ui::from_registry(f.registry.clone(), PERIOD, WINDOW);
    ui.sample();
    for (path, kind) in [
        ("/", "text/html"),
        ("/ui.js", "text/javascript"),
        ("/ui.css", "text/css"),
        ("/api/summary", "application/json"),
    ] {
        let r = ui.respond(path).unwrap();
        let ct = r.headers()[header::CONTENT_TYPE].to_str().unwrap();
        assert!(ct.starts_with(kind), "{path}: {ct}");
        assert!(r.headers().contains_key(header::CONTENT_SECURITY_POLICY));
    }
    assert!(ui.respond("/metrics").is_none());
    assert!(ui.respond("/nope").is_none());
    let json: serde_json::Value = serde_json::to_value(ui.summary()).unwrap();
    assert_eq!(json["now"]["in_flight_decode"], 5.0);
    assert_eq!(json["history"].as_array().unwrap().len(), 1);
    assert!(json["slo"].is_null());
}

#[test]
fn the_page_uses_relative_urls_only() {
    for asset in [INDEX_HTML, UI_JS, UI_CSS] {
        // The SVG namespace is a name, not an address the page loads.
        let asset = asset.replace("'http://www.w3.org/2000/svg'", "");
        let absolute = [
            "\"http", "'http", "`http", "\"//", "'//", "`//", "=\"/", "('/", "(\"/", "(`/", "url(",
        ];
        for absolute in absolute {
            assert!(!asset.contains(absolute), "{absolute} in an asset");
        }
    }
}

#[test]
fn declared_classes_show_before_their_first_request() {
    let f = Fixture::new().with_slo();
    let s = PageSummary::compute(
        &f.reading(),
        &History::new(PERIOD, WINDOW),
        Instant::now(),
        0,
    );
    let classes = s.slo.expect("the classes are declared");
    let names: Vec<_> = classes.iter().map(|c| c.class.as_str()).collect();
    assert_eq!(names, ["agent", "interactive"]);
    assert!(classes
        .iter()
        .all(|c| c.window.requests == 0.0 && c.window.attainment.is_none()));
}

/// The split of TTFT: each part's seconds over the requests that stated any (so the means stack
/// to their mean TTFT), a part no request stated left out, and only what the window holds.
#[test]
fn the_ttft_split_is_each_part_over_the_split_requests_in_the_window() {
    let f = Fixture::new();
    let parts = hist(&f.registry, TTFT_PART, &["model", "part"], &[0.1, 1.0]);
    let observe = |part: &str, v: f64| parts.with_label_values(&["m", part]).observe(v);
    // Before the window: one request, all queue.
    observe("queue", 5.0);
    observe("other", 0.0);
    let mut h = History::new(PERIOD, WINDOW);
    let t0 = Instant::now();
    h.record(&f.reading(), t0, 1_000_000);
    let s = PageSummary::compute(&f.reading(), &h, t0, 1_000_000);
    assert_eq!(s.now.ttft_split_requests, 1.0);
    // In the window: a vLLM request (queue 0.1, prefill 0.2, other 0.05) and an Ollama one
    // (model load 0.4, prefill 0.3, other 0.01).
    for (p, v) in [("queue", 0.1), ("prefill", 0.2), ("other", 0.05)] {
        observe(p, v);
    }
    for (p, v) in [("model_load", 0.4), ("prefill", 0.3), ("other", 0.01)] {
        observe(p, v);
    }
    let s = PageSummary::compute(&f.reading(), &h, t0 + Duration::from_secs(61), 1_061_000);
    assert_eq!(s.now.ttft_split_requests, 2.0);
    let got: Vec<_> = s
        .now
        .ttft_parts
        .iter()
        .map(|p| {
            (
                p.part.as_str(),
                p.requests,
                (p.mean_seconds * 1e6).round() / 1e6,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("queue", 1.0, 0.05),
            ("model_load", 1.0, 0.2),
            ("prefill", 2.0, 0.25),
            ("other", 2.0, 0.03)
        ]
    );
    // The stack is the mean TTFT of the two: (0.35 + 0.71) / 2.
    let stack: f64 = s.now.ttft_parts.iter().map(|p| p.mean_seconds).sum();
    assert!((stack - 0.53).abs() < 1e-9, "{stack}");
    // Nothing stated: no split.
    let g = Fixture::new();
    let s = PageSummary::compute(&g.reading(), &h, t0, 1_000_000);
    assert!(s.now.ttft_parts.is_empty() && s.now.ttft_split_requests == 0.0);
}

#[test]
fn the_workload_traces_lines_are_shown_only_when_it_is_on() {
    let f = Fixture::new();
    let h = History::new(PERIOD, WINDOW);
    let s = PageSummary::compute(&f.reading(), &h, Instant::now(), 1_030_000);
    assert_eq!(s.workload_log, None);
    for (name, v) in [
        (WORKLOAD_LOG_LINES, 120),
        (WORKLOAD_LOG_DROPPED, 3),
        (WORKLOAD_LOG_SKIPPED, 7),
    ] {
        let c = prometheus::IntCounter::new(name, "c").unwrap();
        c.inc_by(v);
        f.registry.register(Box::new(c)).unwrap();
    }
    let s = PageSummary::compute(&f.reading(), &h, Instant::now(), 1_030_000);
    assert_eq!(
        s.workload_log,
        Some(summary::WorkloadLog {
            written: 120.0,
            dropped: 3.0,
            skipped: 7.0
        })
    );
}

//! What the page costs: one reading of the registry (the sampler's work every
//! `--ui-sample-period`) and one `/api/summary`, over an exposition the size of a busy proxy's.
//!
//! `cargo bench --bench ui`. The registry has tokenmeter's families and default buckets with
//! 4 models, every model in all 9 concurrency bands, 2 status codes and 4 outcomes: larger than
//! most deployments, since the cost grows with the number of series, not with traffic.

use std::time::Duration;

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use prometheus::{
    Encoder, Gauge, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry,
    TextEncoder,
};
use tokenmeter::metrics::Buckets;
use tokenmeter::ui::{Reading, Ui};

const MODELS: [&str; 4] = ["llama-3.1-8b", "llama-3.1-70b", "qwen2.5-7b", "mistral-7b"];
const BANDS: [&str; 9] = [
    "1", "2-4", "5-8", "9-16", "17-32", "33-64", "65-128", "129-256", "257+",
];

fn registry() -> Registry {
    let r = Registry::new();
    let b = Buckets::default();
    let hist = |name: &str, labels: &[&str], buckets: &[f64]| {
        let h = HistogramVec::new(
            HistogramOpts::new(name, "h").buckets(buckets.to_vec()),
            labels,
        )
        .expect("histogram");
        r.register(Box::new(h.clone())).expect("register");
        h
    };
    for (name, buckets) in [
        ("tokenmeter_time_to_first_token_seconds", &b.ttft),
        ("tokenmeter_time_to_first_byte_seconds", &b.ttft),
        ("tokenmeter_inter_token_latency_seconds", &b.itl),
        ("tokenmeter_time_per_output_token_seconds", &b.itl),
        ("tokenmeter_request_duration_seconds", &b.duration),
        ("tokenmeter_request_output_tokens", &b.tokens),
        ("tokenmeter_request_input_tokens", &b.tokens),
    ] {
        let h = hist(name, &["model"], buckets);
        for (i, m) in MODELS.iter().enumerate() {
            h.with_label_values(&[m]).observe(0.1 * (i + 1) as f64);
        }
    }
    let tps = hist(
        "tokenmeter_request_tokens_per_second",
        &["model", "concurrency"],
        &b.tps,
    );
    for m in MODELS {
        for (i, band) in BANDS.iter().enumerate() {
            tps.with_label_values(&[m, band])
                .observe(100.0 - 10.0 * i as f64);
        }
    }
    let requests = IntCounterVec::new(
        Opts::new("tokenmeter_requests_total", "c"),
        &["model", "code", "outcome", "api"],
    )
    .expect("counter");
    for m in MODELS {
        for (code, outcome) in [
            ("200", "complete"),
            ("200", "client_disconnect"),
            ("502", "upstream_error"),
            ("504", "timeout"),
        ] {
            requests
                .with_label_values(&[m, code, outcome, "openai"])
                .inc();
        }
    }
    r.register(Box::new(requests)).expect("register");
    let in_flight =
        GaugeVec::new(Opts::new("tokenmeter_requests_in_flight", "g"), &["phase"]).expect("g");
    in_flight.with_label_values(&["decode"]).set(12.0);
    in_flight.with_label_values(&["prefill"]).set(2.0);
    r.register(Box::new(in_flight)).expect("register");
    let g = Gauge::new("tokenmeter_output_tokens_per_second", "g").expect("g");
    g.set(900.0);
    r.register(Box::new(g)).expect("register");
    r
}

fn bench(c: &mut Criterion) {
    let r = registry();
    let render = |r: &Registry| {
        let mut out = Vec::new();
        let _ = TextEncoder::new().encode(&r.gather(), &mut out);
        out
    };
    eprintln!("exposition: {} bytes", render(&r).len());
    c.bench_function("ui/render alone (what /metrics costs)", |b| {
        b.iter(|| black_box(render(&r)))
    });
    // Beside what /metrics costs: the page's one read of the registry.
    c.bench_function("ui/read via gather (gather + reduce)", |b| {
        b.iter(|| black_box(Reading::from_families(&r.gather())))
    });
    let ui = Ui::from_registry(r, Duration::from_secs(5), Duration::from_secs(10));
    // A full ring, as after ten minutes.
    for _ in 0..120 {
        ui.sample();
    }
    c.bench_function("ui/sample (read + record)", |b| b.iter(|| ui.sample()));
    c.bench_function("ui/api_summary (read + summary + JSON)", |b| {
        b.iter(|| black_box(serde_json::to_vec(&ui.summary()).expect("json")))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);

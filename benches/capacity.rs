//! What the capacity model costs: one push (on every token-bearing event of every stream), one
//! wait and one finished request (per request), and one refit (every few seconds, when /metrics
//! is rendered: with a TTFT target it replays the engine over the mix), beside a Prometheus histogram
//! observation (what the meter already does once per token for the inter-token latency) so the
//! figures read as ratios on a noisy machine.
//!
//! `cargo bench --bench capacity`

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use prometheus::{Histogram, HistogramOpts};
use tokenmeter::capacity::{Capacity, CapacityConfig, ClassTargets, Request};

fn model() -> Capacity {
    Capacity::new(
        CapacityConfig {
            classes: vec![ClassTargets {
                name: "interactive".into(),
                tps_floor: Some(20.0),
                ttft: Some(2.0),
                objective: 0.9,
            }],
            ..CapacityConfig::default()
        },
        Instant::now(),
    )
}

fn bench(c: &mut Criterion) {
    let cap = model();
    let at = Instant::now();
    let mut b = 0u32;
    c.bench_function("capacity push", |bench| {
        bench.iter(|| {
            b = b % 64 + 1;
            cap.push(
                black_box(f64::from(b)),
                Duration::from_micros(10_000 + 500 * u64::from(b)),
                1,
                at,
            )
        })
    });
    let h = Histogram::with_opts(HistogramOpts::new("itl", "itl").buckets(vec![
        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    ]))
    .expect("histogram");
    c.bench_function("histogram observe (for scale)", |bench| {
        bench.iter(|| h.observe(black_box(0.021)))
    });

    // Eight threads pushing at once: the push has no lock, so it should not serialise.
    let shared = Arc::new(model());
    c.bench_function("capacity push, 8 threads x 10,000", |bench| {
        bench.iter(|| {
            std::thread::scope(|s| {
                for t in 0..8u32 {
                    let cap = Arc::clone(&shared);
                    s.spawn(move || {
                        for i in 0..10_000u32 {
                            let b = (i + t) % 64 + 1;
                            cap.push(f64::from(b), Duration::from_millis(20), 1, at);
                        }
                    });
                }
            })
        })
    });

    // A refit over a full window: 64 concurrencies, every slot used.
    let full = model();
    for slot in 0..10u64 {
        for b in 1..=64u32 {
            for _ in 0..100 {
                full.push(
                    f64::from(b),
                    Duration::from_micros(10_000 + 500 * u64::from(b)),
                    1,
                    at + Duration::from_secs(90 * slot),
                );
            }
        }
    }
    let end = at + Duration::from_secs(899);
    c.bench_function("capacity refit (64 concurrencies x 10 slots)", |bench| {
        bench.iter(|| black_box(full.refit(end)))
    });

    // Per request: the first token's wait and the finished request joining the mix.
    let request = |i: u32| Request {
        at: end,
        prompt: 200 + 37 * (i % 100),
        cached: 100 * (i % 3),
        output: 50 + 13 * (i % 40),
        ttft: Some(0.05 + 0.0002 * f64::from(200 + 37 * (i % 100))),
        stated_prefill: None,
        stated_queue: None,
        tps: None,
    };
    let mut i = 0u32;
    c.bench_function("capacity waited (per request)", |bench| {
        bench.iter(|| cap.waited(black_box(Duration::from_millis(300)), at))
    });
    c.bench_function("capacity finished (per request)", |bench| {
        bench.iter(|| {
            i = i.wrapping_add(1);
            cap.finished(black_box(request(i)))
        })
    });

    // The same refit with a full mix of 1,024 varied requests: the prefill fit and the replays
    // (the TTFT curve, the class's concurrency and rate limits).
    for i in 0..1024 {
        full.finished(request(i));
    }
    c.bench_function(
        "capacity refit with the first-token end (1,024 requests)",
        |bench| bench.iter(|| black_box(full.refit(end))),
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);

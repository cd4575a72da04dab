//! What the capacity model costs: one push and one step end seen (on every token-bearing event
//! of every stream), the step a request waited for (per first token), one
//! wait and one finished request (per request), and one refit (every few seconds, when /metrics
//! is rendered: with a TTFT target it replays the engine over the mix), beside a Prometheus histogram
//! observation (what the meter already does once per token for the inter-token latency) so the
//! figures read as ratios on a noisy machine.
//!
//! With memory (a KV cache that binds), the replay admits by blocks and preempts; and reading an
//! engine's `/metrics` page (`--engine-metrics`, every 5 s) is parsed and read here too.
//!
//! `cargo bench --bench capacity`

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use prometheus::{Histogram, HistogramOpts};
use tokenmeter::capacity::fit::Fit;
use tokenmeter::capacity::memory::Stated;
use tokenmeter::capacity::{context, Capacity, ClassTargets, Inputs, Request};
use tokenmeter::engine::view;
use tokenmeter::exposition::Scrape;

fn model() -> Capacity {
    Capacity::new(
        Inputs {
            classes: vec![ClassTargets {
                name: "interactive".into(),
                tps_floor: Some(20.0),
                ttft: Some(2.0),
                objective: 0.9,
            }],
            ..Inputs::default()
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
    // Every token-bearing event is a step end seen; every first token looks back for the step
    // that ran when its request arrived (steps every 10 ms, seen by four streams each).
    let ends = model();
    let t0 = Instant::now();
    let mut n = 0u64;
    c.bench_function("capacity step end seen (per event)", |bench| {
        bench.iter(|| {
            n += 1;
            ends.saw_step_end(black_box(
                t0 + Duration::from_micros(10_000 * (n / 4) + n % 4),
            ))
        })
    });
    let now = t0 + Duration::from_micros(10_000 * (n / 4) + 1);
    c.bench_function("capacity running step end (per first token)", |bench| {
        bench.iter(|| ends.running_step_end(black_box(now - Duration::from_millis(15)), now))
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
        arrival: end
            .checked_sub(Duration::from_millis(7 * u64::from(i % 1000)))
            .unwrap_or(end),
        prompt: 200 + 37 * (i % 100),
        cached: 100 * (i % 3),
        output: 50 + 13 * (i % 40),
        ttft: Some(0.05 + 0.0002 * f64::from(200 + 37 * (i % 100))),
        stated_prefill: None,
        stated_queue: None,
        step_end: None,
        tps: Some(40.0 + f64::from(i % 7)),
        batch: Some(f64::from(1 + i % 8)),
    };
    let mut i = 0u32;
    c.bench_function("capacity waited (per request)", |bench| {
        bench.iter(|| cap.waited(black_box(Duration::from_millis(300)), at))
    });
    c.bench_function("capacity finished (per request)", |bench| {
        bench.iter(|| {
            i = i.wrapping_add(1);
            cap.join_mix(black_box(request(i)))
        })
    });

    // The same refit with a full mix of 1,024 varied requests: the prefill fit and the replays
    // (the TTFT curve, the class's concurrency and rate limits).
    for i in 0..1024 {
        full.join_mix(request(i));
    }
    c.bench_function(
        "capacity refit with the first-token end (1,024 requests)",
        |bench| bench.iter(|| black_box(full.refit(end))),
    );

    // The same window with the mix arriving open loop (one request every 170 ms, each in the
    // engine for 3 s: no arrival follows an end): the limits are then Poisson replays' steady
    // state, a rate bisection for each bound of each class.
    let open = Capacity::new(model().config().clone(), at);
    for slot in 0..10u64 {
        for b in 1..=64u32 {
            for _ in 0..100 {
                open.push(
                    f64::from(b),
                    Duration::from_micros(10_000 + 500 * u64::from(b)),
                    1,
                    at + Duration::from_secs(90 * slot),
                );
            }
        }
    }
    for i in 0..1024u32 {
        let arrival = end - Duration::from_secs(200) + Duration::from_millis(170 * u64::from(i));
        open.join_mix(Request {
            at: arrival + Duration::from_secs(3),
            arrival,
            ..request(i)
        });
    }
    c.bench_function(
        "capacity refit with the first-token end, open arrivals (1,024 requests)",
        |bench| bench.iter(|| black_box(open.refit(end))),
    );

    // The same window and mix with a KV cache of 36,000 tokens in blocks of 16: a client of this
    // mix holds about 2,250 tokens, so memory binds at about 16 and every replay past that
    // queues for blocks and preempts.
    let memory = Capacity::new(
        Inputs {
            memory: Stated {
                kv_cache_tokens: Some(36_000),
                block_size: Some(16),
                max_num_seqs: None,
            },
            ..model().config().clone()
        },
        at,
    );
    for slot in 0..10u64 {
        for b in 1..=64u32 {
            for _ in 0..100 {
                memory.push(
                    f64::from(b),
                    Duration::from_micros(10_000 + 500 * u64::from(b)),
                    1,
                    at + Duration::from_secs(90 * slot),
                );
            }
        }
    }
    for i in 0..1024 {
        memory.join_mix(request(i));
    }
    c.bench_function(
        "capacity refit with memory (KV cache binds, 1,024 requests)",
        |bench| bench.iter(|| black_box(memory.refit(end))),
    );

    // The context term alone (`capacity::context`): Theil-Sen over the 256 most recent of the
    // 1,024 requests, the part of a refit it adds.
    let recent: Vec<Request> = (0..1024).map(request).collect();
    let line = Fit {
        base: 0.01,
        per_seq: 0.0005,
        r2: 1.0,
        samples: 64_000,
        points: 64,
        min_concurrency: 1,
        slope_error: 0.0,
        central: (1, 64),
        max_concurrency: 64,
    };
    c.bench_function(
        "capacity context term fit (256 of 1,024 requests)",
        |bench| bench.iter(|| black_box(context::fit(black_box(&recent), &line))),
    );

    // One read of an engine's page: vLLM's families for one model, with its histograms (about
    // 60 KB, the size of a real vLLM 0.x page), parsed and read.
    let page = vllm_page();
    c.bench_function(
        &format!("engine page read ({} KB vLLM page)", page.len() / 1024),
        |bench| bench.iter(|| black_box(view::read(&Scrape::parse(black_box(&page))))),
    );
}

/// A vLLM-shaped `/metrics` page: its gauges and counters, and 20 histograms of 30 buckets.
fn vllm_page() -> String {
    let mut s = String::new();
    let l = r#"engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct""#;
    for (name, v) in [
        ("vllm:num_requests_running", 12.0),
        ("vllm:num_requests_waiting", 3.0),
        ("vllm:kv_cache_usage_perc", 0.87),
        ("vllm:num_preemptions_total", 34.0),
        ("vllm:prompt_tokens_total", 1.2e7),
        ("vllm:generation_tokens_total", 3.4e6),
    ] {
        s.push_str(&format!("# TYPE {name} gauge\n{name}{{{l}}} {v}\n"));
    }
    s.push_str(r#"vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",gpu_memory_utilization="0.9",num_gpu_blocks="27000",num_cpu_blocks="None",prefix_caching_hash_algo="builtin",kv_cache_size_tokens="432000"} 1.0"#);
    s.push('\n');
    for h in 0..20 {
        let name = format!("vllm:histogram_{h}_seconds");
        s.push_str(&format!("# TYPE {name} histogram\n"));
        for b in 0..30 {
            let le = 0.001 * 1.5f64.powi(b);
            s.push_str(&format!("{name}_bucket{{{l},le=\"{le}\"}} {}\n", b * 100));
        }
        s.push_str(&format!("{name}_bucket{{{l},le=\"+Inf\"}} 3000\n"));
        s.push_str(&format!(
            "{name}_sum{{{l}}} 1234.5\n{name}_count{{{l}}} 3000\n"
        ));
    }
    s
}

criterion_group!(benches, bench);
criterion_main!(benches);

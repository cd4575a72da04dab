//! The capacity answer's memory end against the simulator, whose KV cache is known.
//!
//! With long contexts the cache fills before decode slows or prefill queues: the bench's
//! clients see TTFT jump once more of them run than the cache holds (the newcomers wait for a
//! whole request to end), while the decode bound still says hundreds. Each case runs
//! closed-loop levels as `tokenmeter bench --concurrency` does, measures each level's TTFT p90
//! at the clients, and holds the proxy's answer to it:
//!
//! - `tokenmeter_capacity_max_concurrency` lies between the last level that met the class and
//!   the first that missed (the edge the bench measures);
//! - where the cache is small, the `kv_cache` bound is the answer (or ties with the first
//!   token's bound, which the replay's wait for memory also brings down), and the decode bound
//!   is far above it;
//! - where the cache is large, the `kv_cache` bound is far above the answer and the answer is
//!   what it is without memory.
//!
//! Each case takes its levels' time (about 60 s of wall time each).

use std::time::Duration;

use tokenmeter_tools::exposition::Scrape;
use tokenmeter_tools::sim::kv::KvConfig;
use tokenmeter_tools::sim::{Model, Sim, SimConfig};

use crate::support::levels::{self, Measured};
use crate::support::{serial, spawn_proxy};

struct Case {
    model: Model,
    /// The simulator's cache, in tokens of 16-token blocks; the proxy is told the same.
    kv_cache_tokens: u32,
    prompt_words: usize,
    output_tokens: u64,
    /// The `--slo` class, named `chat`.
    class: &'static str,
    ttft: f64,
    levels: &'static [usize],
    hold: Duration,
}

#[derive(Debug)]
struct Outcome {
    /// Each level's TTFT p90 at the clients, and the prompts their usage stated.
    measured: Measured,
    limit_ttft: f64,
    limit_tps: f64,
    limit_kv: f64,
    max_concurrency: f64,
    kv_tokens_per_request: f64,
}

async fn run(case: &Case) -> Outcome {
    let sim = Sim::bind(&SimConfig {
        model: case.model,
        kv: Some(KvConfig {
            tokens: case.kv_cache_tokens,
            block_size: 16,
        }),
        ..SimConfig::default()
    })
    .await
    .expect("bind the simulator");
    let upstream = format!("http://{}", sim.local_addr());
    let sim_task = tokio::spawn(async move {
        let _ = sim.serve(std::future::pending()).await;
    });
    let kv = case.kv_cache_tokens.to_string();
    let proxy = spawn_proxy(
        &upstream,
        &[
            "--slo",
            case.class,
            "--kv-cache-tokens",
            &kv,
            "--block-size",
            "16",
        ],
    )
    .await;
    let driver = levels::driver(
        &proxy.url(),
        "memory-test",
        case.prompt_words,
        case.output_tokens,
        5,
    );
    let measured = levels::run(&driver, case.levels, case.hold).await;
    proxy.capacity.next_report().await;
    let text = proxy.scrape().await;
    sim_task.abort();
    let s = Scrape::parse(&text);
    let one = |name: &str, labels: &[(&str, &str)]| {
        s.select(name, labels)
            .next()
            .unwrap_or_else(|| panic!("no {name}{labels:?} in\n{text}"))
            .value
    };
    let limit = |bound| {
        one(
            "tokenmeter_capacity_limit_concurrency",
            &[("class", "chat"), ("bound", bound)],
        )
    };
    Outcome {
        measured,
        limit_ttft: limit("ttft"),
        limit_tps: limit("tokens_per_second"),
        limit_kv: limit("kv_cache"),
        max_concurrency: one("tokenmeter_capacity_max_concurrency", &[("class", "chat")]),
        kv_tokens_per_request: one("tokenmeter_capacity_kv_tokens_per_request", &[]),
    }
}

/// The mean footprint a client holds, from the mix the clients saw: contexts p ..= p + o - 1
/// in whole blocks of 16.
fn footprint(prompt: f64, output: u64) -> f64 {
    let p = prompt.round() as u64;
    (p..p + output).map(|t| t.div_ceil(16) * 16).sum::<u64>() as f64 / output as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_cache_holds_the_limit_where_memory_runs_out() {
    let _turn = serial().await;
    // 10 ms + 0.2 ms steps, 0.05 ms per prompt token (prefill is not what binds), prompts of
    // about 450 tokens and 150 token answers: a client holds about 32 blocks of 16 on
    // average and 37 at its peak. A cache of 128 blocks (2,048 tokens) holds three, and a
    // fourth waits for memory; decode alone would hold hundreds at 10 tokens/s.
    let case = Case {
        model: Model {
            step_base: Duration::from_millis(10),
            step_per_seq: Duration::from_micros(200),
            prefill_per_token: Duration::from_micros(50),
            step_per_1k_kv_tokens: Duration::ZERO,
            max_batch: 256,
        },
        kv_cache_tokens: 2048,
        prompt_words: 400,
        output_tokens: 150,
        class: "chat:ttft=1s,tps=10,objective=0.9",
        ttft: 1.0,
        levels: &[1, 2, 3, 4, 6],
        hold: Duration::from_secs(12),
    };
    let o = run(&case).await;
    let why = format!("{o:#?}");
    let (last_met, first_missed) = o.measured.edge(case.ttft, &why);
    assert!(
        (last_met..=first_missed).contains(&o.max_concurrency),
        "max concurrency {} outside [{last_met}, {first_missed}]\n{why}",
        o.max_concurrency
    );
    assert_eq!(o.max_concurrency, o.limit_kv.min(o.limit_ttft), "{why}");
    assert!(o.limit_kv <= o.limit_ttft, "memory binds\n{why}");
    assert!(o.limit_tps > 10.0 * o.limit_kv, "{why}");
    // The footprint the model took is the one the clients' requests have, within a block.
    let want = footprint(o.measured.usage_prompt(), case.output_tokens);
    assert!(
        (o.kv_tokens_per_request - want).abs() <= 16.0,
        "footprint {} vs {want}\n{why}",
        o.kv_tokens_per_request
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_cache_leaves_the_limit_to_the_first_token() {
    let _turn = serial().await;
    // The first-token case (2,000-token prompts at 0.2 ms a token, 2 s at 90%), with a cache of
    // 65,536 tokens: some 30 clients fit, the first token holds about four.
    let case = Case {
        model: Model {
            step_base: Duration::from_millis(10),
            step_per_seq: Duration::from_micros(200),
            prefill_per_token: Duration::from_micros(200),
            step_per_1k_kv_tokens: Duration::ZERO,
            max_batch: 256,
        },
        kv_cache_tokens: 65536,
        prompt_words: 2000,
        output_tokens: 100,
        class: "chat:ttft=2s,tps=10,objective=0.9",
        ttft: 2.0,
        levels: &[1, 2, 4, 6, 8],
        hold: Duration::from_secs(12),
    };
    let o = run(&case).await;
    let why = format!("{o:#?}");
    let (last_met, first_missed) = o.measured.edge(case.ttft, &why);
    assert!(
        (last_met..=first_missed).contains(&o.max_concurrency),
        "max concurrency {} outside [{last_met}, {first_missed}]\n{why}",
        o.max_concurrency
    );
    assert_eq!(o.max_concurrency, o.limit_ttft, "{why}");
    assert!(
        o.limit_kv > 4.0 * o.limit_ttft,
        "memory does not bind\n{why}"
    );
}

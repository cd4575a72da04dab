//! Record and replay: a `tokenmeter bench` run through a proxy with `--workload-log`, replayed
//! with `tokenmeter bench --trace` through a second proxy against a fresh simulator whose prefix
//! cache is learnt from the prompts (`--prefix-cache-tokens`). Must hold: the same requests, the
//! same lengths per request, arrivals within 20 ms of the recorded ones (beyond what the machine
//! itself held the process back), and prefix-cache hits within 5% of the recorded run's.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use serde_json::{json, Value};
use tokenmeter_tools::bench::progress::Progress;
use tokenmeter_tools::bench::prompt::WORDS;
use tokenmeter_tools::bench::{self, BenchArgs};

use crate::support::metrics::metric;
use crate::support::{self as s, config_of, sim_flags, spawn, start_sim, Proxy};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

/// A tokenizer with one id per bench word (with and without its leading space): a prompt of N
/// bench words is N tokens to it, as to the simulator.
fn model_dir(tag: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("tokenmeter-it-replay-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let mut vocab = serde_json::Map::new();
    vocab.insert("<unk>".into(), json!(0));
    for w in WORDS {
        let n = vocab.len();
        vocab.insert((*w).into(), json!(n));
        vocab.insert(format!(" {w}"), json!(n + 1));
    }
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {
            "type": "Split",
            "pattern": {"Regex": " ?\\w+| ?[^\\w\\s]|\\s"},
            "behavior": "Isolated",
            "invert": false
        },
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).expect("write");
    dir
}

fn tempdir(tag: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("tokenmeter-it-replay-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    dir
}

/// A fresh simulator with a prefix cache learnt from the prompts, and a proxy in front of it
/// writing its trace to `trace` (held 300 ms for order: the test stops it before reading).
async fn recorder(trace: &Path, tokenizer: &Path) -> (Proxy, String) {
    let sim = format!(
        "http://{}",
        start_sim(sim_flags(&["--prefix-cache-tokens", "1000000"])).await
    );
    let trace = trace.to_string_lossy().to_string();
    let tok = tokenizer.to_string_lossy().to_string();
    let mut cfg = config_of(&sim, &["--workload-log", &trace, "--tokenizer", &tok]);
    if let Some(w) = cfg.workload.as_mut() {
        w.hold = Duration::from_millis(300);
    }
    (spawn(cfg).await, sim)
}

async fn run_bench(target: &str, out: &Path, extra: &[&str]) -> bench::report::Report {
    let out_s = out.to_string_lossy().to_string();
    let mut argv = vec![
        "bench",
        "--target",
        target,
        "--out",
        &out_s,
        "--endpoint",
        "completions",
    ];
    argv.extend_from_slice(extra);
    let cfg = Cli::try_parse_from(argv)
        .expect("bench flags")
        .bench
        .validate()
        .expect("valid bench flags");
    bench::run(&cfg, Progress::disabled(), Default::default())
        .await
        .expect("the bench run")
}

/// The proxy stopped (its trace written whole), and the trace's lines.
async fn stop(mut proxy: Proxy, trace: &Path) -> Vec<Value> {
    proxy.shutdown();
    (&mut proxy.task).await.expect("the server ends");
    std::fs::read_to_string(trace)
        .expect("the trace")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

async fn prefix_hits(sim: &str) -> f64 {
    let text = s::client::get_text(&format!("{sim}/metrics")).await;
    metric("vllm:prefix_cache_hits_total").sum(&text)
}

fn n(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_bench_run_replays_with_its_lengths_arrivals_and_prefix_hits() {
    let _turn = s::serial().await;
    let dir = tempdir("record");
    let tok = model_dir("record");
    let recorded_path = dir.join("recorded.jsonl");
    let replayed_path = dir.join("replayed.jsonl");

    // The recording: two open-loop bench runs at once through one proxy, 600- and 1,100-word
    // prompts sharing their first 512 words (one block), 16 and 32 output tokens.
    let (proxy, sim) = recorder(&recorded_path, &tok).await;
    let (out_a, out_b) = (dir.join("a"), dir.join("b"));
    std::fs::create_dir_all(&out_a).expect("dir");
    std::fs::create_dir_all(&out_b).expect("dir");
    let url = proxy.url();
    let common = ["--shared-prefix-tokens", "512", "--seed", "3"];
    let a = [
        &common[..],
        &[
            "--request-rate",
            "8",
            "--requests",
            "24",
            "--prompt-tokens",
            "600",
            "--output-tokens",
            "16",
        ],
    ]
    .concat();
    let b = [
        &common[..],
        &[
            "--request-rate",
            "6",
            "--requests",
            "18",
            "--prompt-tokens",
            "1100",
            "--output-tokens",
            "32",
        ],
    ]
    .concat();
    let (ra, rb) = tokio::join!(run_bench(&url, &out_a, &a), run_bench(&url, &out_b, &b));
    assert_eq!((ra.levels[0].errors, rb.levels[0].errors), (0, 0));
    let recorded_hits = prefix_hits(&sim).await;
    let recorded = stop(proxy, &recorded_path).await;
    // Each run's probe and its requests.
    assert_eq!(recorded.len(), 2 + 24 + 18, "{recorded:?}");
    assert!(recorded.iter().all(|l| l["exact"] == json!(true)));

    // The replay, through a second proxy in front of a fresh simulator.
    let (proxy, sim) = recorder(&replayed_path, &tok).await;
    let out_r = dir.join("r");
    std::fs::create_dir_all(&out_r).expect("dir");
    let trace = recorded_path.to_string_lossy().to_string();
    let stalls = s::StallWatch::start();
    let report = run_bench(&proxy.url(), &out_r, &["--trace", &trace]).await;
    let stalled = stalls.worst();
    assert_eq!(report.levels[0].errors, 0);
    let replayed_hits = prefix_hits(&sim).await;
    let replayed = stop(proxy, &replayed_path).await;
    // The replay's own probe first, then the trace's requests.
    let (probe, replayed) = replayed.split_first().expect("the probe");
    assert_eq!(n(probe, "output_length"), 1);
    assert_eq!(replayed.len(), recorded.len(), "the same requests");

    // Each recorded request has a replayed one of its lengths, and the nearest in time is
    // within the bound (requests due at the same moment may reach the proxy in either order).
    let since = |l: &Value, t0: u64| n(l, "timestamp") as i64 - t0 as i64;
    let t0 = (n(&recorded[0], "timestamp"), n(&replayed[0], "timestamp"));
    let mut unused: Vec<&Value> = replayed.iter().collect();
    let mut worst = 0i64;
    for was in &recorded {
        let key = |l: &Value| (n(l, "input_length"), n(l, "output_length"));
        let at = since(was, t0.0);
        let (i, off) = unused
            .iter()
            .enumerate()
            .filter(|(_, is)| key(is) == key(was))
            .map(|(i, is)| (i, (since(is, t0.1) - at).abs()))
            .min_by_key(|&(_, off)| off)
            .unwrap_or_else(|| panic!("no replayed request has the lengths of {was}"));
        let is = unused.swap_remove(i);
        assert_eq!(
            was["hash_ids"].as_array().map(Vec::len),
            is["hash_ids"].as_array().map(Vec::len),
            "{was} replayed as {is}"
        );
        worst = worst.max(off);
    }
    eprintln!(
        "arrivals: worst {worst} ms off the recorded ones; the machine stalled the process up to {:.1} ms; prefix-cache hits {recorded_hits} recorded, {replayed_hits} replayed",
        stalled.as_secs_f64() * 1e3
    );
    // Milliseconds on both sides: one of rounding each.
    let allowed = 20 + 2 + stalled.as_millis() as i64;
    assert!(
        worst <= allowed,
        "an arrival {worst} ms off the recorded one (allowed {allowed} ms)"
    );
    assert!(recorded_hits > 0.0);
    let off = (replayed_hits - recorded_hits).abs() / recorded_hits;
    assert!(
        off <= 0.05,
        "prefix-cache hits: {recorded_hits} recorded, {replayed_hits} replayed ({:.1}% apart)",
        off * 100.0
    );
    let _ = std::fs::remove_dir_all(&dir);
}

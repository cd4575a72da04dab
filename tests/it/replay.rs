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
    crate::support::tokenizer::word_level(&format!("replay-{tag}"), WORDS)
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
    // The recorded arrivals carry the machine's stalls as much as the replayed ones: both are
    // watched.
    let stalls = s::StallWatch::start();
    let (ra, rb) = tokio::join!(run_bench(&url, &out_a, &a), run_bench(&url, &out_b, &b));
    let stalled_recording = stalls.worst();
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
    let stalled = stalls.worst() + stalled_recording;
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
        "arrivals: worst {worst} ms off the recorded ones; the machine stalled the process up to {:.1} ms (recording and replay); prefix-cache hits {recorded_hits} recorded, {replayed_hits} replayed",
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

/// The class the what-if is asked about: 40 tokens/s and a 1 s TTFT for 95% of requests.
const CLASS: &str = "chat:ttft=1s,tps=40,objective=0.95";
const OBJECTIVE: f64 = 0.95;

/// The share of a replay's requests that met the class, by the proxy's request log: the first
/// tenth by arrival left out, as the what-if leaves out its warm-up, and the bench's probe
/// with it.
fn share_met(log: &Path) -> (f64, usize) {
    let mut lines: Vec<(f64, bool)> = std::fs::read_to_string(log)
        .expect("the request log")
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("a JSON line"))
        .filter(|l| l["class"] == json!("chat"))
        .map(|l| {
            let end = l["time"].as_str().expect("time").to_owned();
            let arrived = rfc3339_seconds(&end) - l["duration_seconds"].as_f64().unwrap_or(0.0);
            (arrived, l["slo"] == json!("met"))
        })
        .collect();
    lines.sort_by(|a, b| a.0.total_cmp(&b.0));
    let judged = &lines[lines.len() / 10..];
    let met = judged.iter().filter(|(_, m)| *m).count();
    (met as f64 / judged.len().max(1) as f64, judged.len())
}

/// Seconds of the day of an RFC 3339 UTC time with milliseconds (the request log's `time`):
/// enough to order a test's requests, which do not run over midnight... unless they do, which
/// only shifts the order of a few in the tenth left out.
fn rfc3339_seconds(t: &str) -> f64 {
    let clock = t
        .split('T')
        .nth(1)
        .unwrap_or("0:0:0Z")
        .trim_end_matches('Z');
    let mut parts = clock.split(':').map(|p| p.parse::<f64>().unwrap_or(0.0));
    let (h, m, s) = (
        parts.next().unwrap_or(0.0),
        parts.next().unwrap_or(0.0),
        parts.next().unwrap_or(0.0),
    );
    h * 3600.0 + m * 60.0 + s
}

/// A fresh proxy judging the class in front of `sim`, with a request log, and the trace
/// replayed through it at `multiple` times its rate: the share of its requests that met.
async fn replayed_share(sim: &str, trace: &Path, multiple: f64, dir: &Path) -> (f64, usize) {
    let log = dir.join(format!("requests-x{multiple:.3}.jsonl"));
    let log_s = log.to_string_lossy().to_string();
    let proxy = spawn(config_of(sim, &["--slo", CLASS, "--request-log", &log_s])).await;
    let out = dir.join(format!("replay-x{multiple:.3}"));
    std::fs::create_dir_all(&out).expect("dir");
    let scale = format!("{}", 1.0 / multiple);
    let trace = trace.to_string_lossy().to_string();
    let report = run_bench(
        &proxy.url(),
        &out,
        &["--trace", &trace, "--time-scale", &scale],
    )
    .await;
    assert_eq!(report.levels[0].errors, 0);
    let _ = stop(proxy, Path::new("/dev/null")).await;
    share_met(&log)
}

/// `tokenmeter capacity --trace` against the simulator: the rate multiple it states for a
/// recorded trace is within 15% of the highest multiple a replay meets: a replay at the stated
/// multiple / 1.15 meets the class, one at x 1.15 misses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_on_a_trace_states_the_multiple_a_replay_meets_within_15_percent() {
    let _turn = s::serial().await;
    let dir = tempdir("whatif");
    // `tokenmeter sim` as it starts: 16 ms + 0.2 ms per sequence a step, 0.05 ms a prompt
    // token: 40 tokens/s up to about 45 streams of 128-token answers, some 14 requests a second.
    let (sim, stop_sim) = crate::traffic_capacity::simulator(tokenmeter_tools::sim::Model {
        step_base: Duration::from_millis(16),
        step_per_seq: Duration::from_micros(200),
        prefill_per_token: Duration::from_micros(50),
        step_per_1k_kv_tokens: Duration::ZERO,
        max_batch: 256,
    });
    // The recording: Poisson arrivals at 5 a second for 30 s. The edge is at about 7.5 a second
    // once each arrival's prefill is counted into the steps, so the answer is about x1.5. A
    // shorter trace replays too briefly at the higher multiples to reach its steady state: its
    // last requests, with nothing arriving behind them, speed up, and a replay meets more than
    // the steady traffic it stands for would.
    let trace = dir.join("recorded.jsonl");
    let trace_s = trace.to_string_lossy().to_string();
    let mut cfg = config_of(
        &sim,
        &["--slo", CLASS, "--workload-log", &trace_s, "--gpus", "1"],
    );
    if let Some(w) = cfg.workload.as_mut() {
        w.hold = Duration::from_millis(300);
    }
    let proxy = spawn(cfg).await;
    let out = dir.join("record");
    std::fs::create_dir_all(&out).expect("dir");
    let load = [
        "--request-rate",
        "5",
        "--duration",
        "30s",
        "--prompt-tokens",
        "256",
        "--output-tokens",
        "128",
        "--seed",
        "5",
    ];
    run_bench(&proxy.url(), &out, &load).await;
    // Asked as a planner asks: the command against the proxy's /metrics.
    let metrics = format!("http://{}/metrics", proxy.metrics_addr);
    let asked = trace_s.clone();
    let answer = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
            .args([
                "capacity",
                "--metrics",
                &metrics,
                "--trace",
                &asked,
                "--format",
                "json",
            ])
            .output()
            .expect("run tokenmeter capacity")
    })
    .await
    .expect("the command's thread");
    let _ = stop(proxy, &trace).await;
    let text = String::from_utf8_lossy(&answer.stdout).to_string();
    assert!(
        answer.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&answer.stderr)
    );
    let json: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    eprintln!("engine: {}\ntrace: {}", json["engine"], json["trace"]);
    let chat = json["classes"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["class"] == json!("chat")))
        .unwrap_or_else(|| panic!("no chat class in {text}"))
        .clone();
    let stated = chat["max_multiple"]
        .as_f64()
        .unwrap_or_else(|| panic!("no multiple in {chat}"));
    assert_eq!(chat["max_multiple_is"], json!("edge"), "{chat}");

    let (below, n_below) = replayed_share(&sim, &trace, stated / 1.15, &dir).await;
    let (above, n_above) = replayed_share(&sim, &trace, stated * 1.15, &dir).await;
    drop(stop_sim);
    eprintln!(
        "capacity --trace: x{stated:.2} ({} binds); replayed at x{:.2}: {:.1}% of {n_below} met; at x{:.2}: {:.1}% of {n_above} met",
        chat["binds"],
        stated / 1.15,
        100.0 * below,
        stated * 1.15,
        100.0 * above
    );
    assert!(
        below >= OBJECTIVE,
        "the stated x{stated:.2} / 1.15 missed the class: {below}\n{text}"
    );
    assert!(
        above < OBJECTIVE,
        "the stated x{stated:.2} x 1.15 still met the class: {above}\n{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

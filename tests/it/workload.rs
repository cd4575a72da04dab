//! `--workload-log` against the simulator: one Mooncake line per request for generation, in
//! arrival order, with exact lengths, the prompt's blocks numbered by shared prefix (with a
//! tokenizer whose tokens are the simulator's own), conversations numbered by first sight, the
//! file reopened after SIGHUP, and a disk that refuses every write costing lines, never requests.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::client;
use crate::support::{config_of, sim_flags, spawn, start_sim, Proxy};

/// Three-letter words: a prompt of N of them, joined by spaces, is 4N - 1 characters, so N
/// tokens to the simulator (which counts 4 characters a token) and to [`model_dir`]'s tokenizer.
const WORDS: [&str; 12] = [
    "the", "and", "for", "are", "but", "not", "you", "all", "any", "can", "had", "her",
];

/// Tokens a block stands for in these tests: small, so short prompts have several.
const BLOCK: usize = 4;

/// A tokenizer with one id per word (with and without its leading space), pieces cut where
/// the simulator's tokens begin.
fn model_dir(tag: &str) -> PathBuf {
    crate::support::tokenizer::word_level(&format!("workload-{tag}"), &WORDS)
}

/// `n` words from `WORDS`, starting at `from`.
fn words(from: usize, n: usize) -> String {
    (0..n)
        .map(|i| WORDS[(from + i * 7) % WORDS.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

fn completion(prompt: &str, max_tokens: u64) -> String {
    json!({
        "model": "m",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
    .to_string()
}

/// A proxy with `flags` in front of the simulator, its trace at `path`, held `hold` for order.
async fn proxy(path: &Path, hold: Duration, flags: &[&str]) -> Proxy {
    let sim = format!("http://{}", start_sim(sim_flags(&[])).await);
    let trace = path.to_string_lossy().to_string();
    let mut argv = vec!["--workload-log", trace.as_str()];
    argv.extend_from_slice(flags);
    let mut cfg = config_of(&sim, &argv);
    if let Some(w) = cfg.workload.as_mut() {
        w.hold = hold;
    }
    spawn(cfg).await
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// Waits until `path` has `n` lines (the writer holds them a moment).
async fn wait_for_lines(path: &Path, n: usize) -> Vec<Value> {
    for _ in 0..200 {
        let got = lines(path);
        if got.len() >= n {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    lines(path)
}

fn temp(tag: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("tokenmeter-it-trace-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    dir
}

async fn post(proxy: &Proxy, body: &str, conversation: Option<&str>) {
    let mut headers = vec![("content-type", "application/json")];
    if let Some(c) = conversation {
        headers.push(("x-session", c));
    }
    let seen = client::post_with(&format!("{}/v1/completions", proxy.url()), body, &headers).await;
    assert_eq!(seen.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_per_request_in_arrival_order_with_exact_lengths_and_prefix_blocks() {
    let dir = temp("lines");
    let path = dir.join("trace.jsonl");
    let tok = model_dir("lines").to_string_lossy().to_string();
    let block = BLOCK.to_string();
    let mut proxy = proxy(
        &path,
        tokenmeter::workload::HOLD,
        &[
            "--tokenizer",
            &tok,
            "--workload-block-tokens",
            &block,
            "--workload-conversation-header",
            "x-session",
        ],
    )
    .await;
    // Two prompts sharing their first 8 words (two blocks), then one of its own; and a list of
    // models, which is no workload.
    let shared = words(0, 8);
    let prompts = [
        format!("{shared} {}", words(3, 2)),
        format!("{shared} {}", words(5, 3)),
        words(1, 9),
    ];
    let pause = Duration::from_millis(60);
    for (i, (prompt, session)) in prompts.iter().zip(["s1", "s2", "s1"]).enumerate() {
        post(&proxy, &completion(prompt, 5 + i as u64), Some(session)).await;
        tokio::time::sleep(pause).await;
    }
    let models = client::get_text(&format!("{}/v1/models", proxy.url())).await;
    assert!(!models.is_empty());
    proxy.settled(4.0).await;
    // Held for order (30 s): nothing is written until the proxy stops, which writes it all.
    assert!(lines(&path).is_empty(), "held for 30 s");
    proxy.shutdown();
    (&mut proxy.task).await.expect("the server ends");

    let got = lines(&path);
    assert_eq!(got.len(), 3, "{got:?}");
    let field = |i: usize, k: &str| got[i][k].clone();
    let ids: Vec<Value> = (0..3).map(|i| field(i, "hash_ids")).collect();
    assert_eq!(
        ids,
        vec![json!([0, 1, 2]), json!([0, 1, 3]), json!([4, 5, 6])]
    );
    for (i, (input, output)) in [(10, 5), (11, 6), (9, 7)].into_iter().enumerate() {
        assert_eq!(field(i, "input_length"), json!(input), "{:?}", got[i]);
        assert_eq!(field(i, "output_length"), json!(output));
        assert_eq!(field(i, "exact"), json!(true));
        assert_eq!(field(i, "outcome"), json!("complete"));
        assert_eq!(field(i, "model"), json!("m"));
    }
    let conv: Vec<Value> = (0..3).map(|i| field(i, "conversation_id")).collect();
    assert_eq!(conv, vec![json!(0), json!(1), json!(0)]);
    let t: Vec<u64> = (0..3)
        .map(|i| field(i, "timestamp").as_u64().expect("ms"))
        .collect();
    assert_eq!(t[0], 0);
    // Each request was sent after the one before ended and a pause: at least that far apart.
    assert!(
        t.windows(2)
            .all(|w| w[1] >= w[0] + pause.as_millis() as u64),
        "{t:?}"
    );
    // The key order is the contract's.
    let text = std::fs::read_to_string(&path).expect("read");
    let first = text.lines().next().expect("a line");
    let mut at = 0;
    for k in tokenmeter::workload::line::KEYS {
        if let Some(p) = first.find(&format!("\"{k}\":")) {
            assert!(p >= at, "{k} out of order in {first}");
            at = p;
        }
    }
    assert!(!first.contains("the and"), "no prompt text in the trace");
    let exposition = String::from_utf8(proxy.metrics.render()).expect("utf8");
    assert!(
        exposition.contains("tokenmeter_workload_log_lines_total 3"),
        "{exposition}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_tokenizer_lines_have_lengths_and_no_blocks_and_a_hangup_starts_a_new_file() {
    let dir = temp("hup");
    let path = dir.join("trace.jsonl");
    let proxy = proxy(&path, Duration::from_millis(100), &[]).await;
    post(&proxy, &completion(&words(0, 30), 12), None).await;
    let got = wait_for_lines(&path, 1).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["input_length"], json!(30));
    assert_eq!(got[0]["output_length"], json!(12));
    assert!(got[0].get("hash_ids").is_none(), "{:?}", got[0]);
    assert!(got[0].get("conversation_id").is_none());

    // Rotated: moved away, then the signal. The next line goes to a new file at the path, its
    // times counted from its own first line.
    let moved = dir.join("trace.jsonl.1");
    std::fs::rename(&path, &moved).expect("rotate");
    tokenmeter::logfile::reopen_all();
    tokio::time::sleep(Duration::from_millis(300)).await;
    post(&proxy, &completion(&words(2, 7), 3), None).await;
    let got = wait_for_lines(&path, 1).await;
    assert_eq!(got.len(), 1, "the new file");
    assert_eq!(
        (got[0]["timestamp"].clone(), got[0]["input_length"].clone()),
        (json!(0), json!(7))
    );
    assert_eq!(lines(&moved).len(), 1, "the old file keeps its line");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_that_refuses_every_write_costs_lines_not_requests() {
    let full = Path::new("/dev/full");
    if !full.exists() {
        crate::support::skip(
            &crate::support::current_test(),
            "no /dev/full on this system to refuse the writes",
        );
        return;
    }
    let proxy = proxy(full, Duration::from_millis(50), &[]).await;
    for i in 0..5 {
        post(&proxy, &completion(&words(i, 20), 8), None).await;
    }
    let s = proxy
        .eventually(|s| s.contains("tokenmeter_workload_log_dropped_total 5"))
        .await;
    assert!(s.contains("tokenmeter_workload_log_dropped_total 5"), "{s}");
    assert!(s.contains("tokenmeter_workload_log_lines_total 0"), "{s}");
}

/// A client that leaves mid-stream: its line says so, its prompt is the tokenizer's count (no
/// usage came), and its output is what the tokenizer counted of the text the proxy passed on,
/// never more than the simulator made (its own account, `/sim/stats`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_is_traced_with_what_it_got() {
    let dir = temp("left");
    let path = dir.join("trace.jsonl");
    let tok = model_dir("left").to_string_lossy().to_string();
    let sim = format!("http://{}", start_sim(sim_flags(&[])).await);
    let trace = path.to_string_lossy().to_string();
    let mut cfg = config_of(&sim, &["--workload-log", &trace, "--tokenizer", &tok]);
    if let Some(w) = cfg.workload.as_mut() {
        w.hold = Duration::from_millis(50);
    }
    let proxy = spawn(cfg).await;
    let body = json!({"model": "m", "prompt": words(0, 40), "max_tokens": 5000, "stream": true})
        .to_string();
    let got =
        client::post_read_then_drop(&format!("{}/v1/completions", proxy.url()), &body, 2048).await;
    assert!(got.len() >= 2048);
    let lines = wait_for_lines(&path, 1).await;
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line = &lines[0];
    assert_eq!(line["outcome"], json!("client_disconnect"), "{line}");
    assert_eq!(
        line["input_length"],
        json!(40),
        "the tokenizer's count: {line}"
    );
    assert_eq!(
        line["exact"],
        json!(true),
        "both counted by the tokenizer: {line}"
    );
    let out = line["output_length"].as_u64().expect("output_length");
    let stats: Value =
        serde_json::from_str(&client::get_text(&format!("{sim}/sim/stats")).await).expect("stats");
    let made = stats["requests"][0]["output_tokens"]
        .as_u64()
        .expect("the sim's count");
    assert!(
        out >= 1 && out <= made,
        "traced {out}, the simulator made {made}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

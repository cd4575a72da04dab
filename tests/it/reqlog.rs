//! The request log (`--request-log`): one line per finished request, each field exact against
//! what a scripted upstream sent; nothing of the prompt or the credentials in it or on stderr;
//! and a log nobody reads never holds a stream back.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::Value;

use tokenmeter::metrics::names;

use crate::support::client;
use crate::support::metrics::metric;
use crate::support::upstream::{self, Reply, Step};

const MS: Duration = Duration::from_millis(1);

/// What the prompt says and the credential sent: neither may appear in the log or on stderr.
const MARKER: &str = "PROMPT-MARKER-5b1e9c";
const SECRET: &str = "sk-live-SECRET-8d2f41";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// The upstream's time to the first token; the log's TTFT is at least this, and within
/// [`TTFT_TOLERANCE`] of it (loopback and a loaded 2-core machine).
const TTFT: Duration = Duration::from_millis(80);
const TTFT_TOLERANCE: f64 = 0.25;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// A vLLM-style stream: 4 content tokens, then usage with the per-request `metrics` object.
fn vllm_steps() -> Vec<Step> {
    let mut steps = upstream::openai_chat(TTFT, 4, 5 * MS, false);
    let done = steps.pop();
    steps.push(Step::Send(Bytes::from_static(
        b"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"test-model\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n",
    )));
    steps.push(Step::Send(Bytes::from_static(
        b"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"test-model\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":4,\"total_tokens\":16,\"prompt_tokens_details\":{\"cached_tokens\":8}},\"metrics\":{\"queue_time_ms\":12.5,\"time_to_first_token_ms\":30.0,\"generation_time_ms\":40.0}}\n\n",
    )));
    steps.extend(done);
    steps
}

/// The bytes a script sends, in order.
fn script_bytes(steps: &[Step]) -> Vec<u8> {
    let mut out = Vec::new();
    for s in steps {
        if let Step::Send(b) = s {
            out.extend_from_slice(b);
        }
    }
    out
}

/// A started tokenmeter binary, and where it listens.
struct Running {
    child: Child,
    port: u16,
    mport: u16,
}

impl Running {
    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    async fn scrape(&self) -> String {
        client::get_text(&format!("http://127.0.0.1:{}/metrics", self.mport)).await
    }

    fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the binary in front of `upstream` with `extra` flags, stdout and stderr as given,
/// and waits for its metrics listener.
async fn start(upstream: &str, extra: &[&str], stdout: Stdio, stderr: Stdio) -> Running {
    let (port, mport) = (free_port(), free_port());
    let listen = format!("127.0.0.1:{port}");
    let mlisten = format!("127.0.0.1:{mport}");
    let mut args = vec![
        "--upstream",
        upstream,
        "--listen",
        &listen,
        "--metrics-listen",
        &mlisten,
    ];
    args.extend_from_slice(extra);
    let child = Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
        .env_remove("TOKENMETER_UPSTREAM")
        .env("TOKENMETER_LOG", "debug")
        .args(&args)
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .expect("spawn");
    for _ in 0..400 {
        if std::net::TcpStream::connect(("127.0.0.1", mport)).is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Running { child, port, mport }
}

/// POSTs `body` with `headers`; the status and the whole body.
async fn post(url: &str, body: &str, headers: &[(&str, &str)]) -> (u16, Vec<u8>) {
    let mut req = http::Request::builder()
        .method(http::Method::POST)
        .uri(url)
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    let resp = client::client().request(req).await.expect("response");
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, body.to_vec())
}

fn chat_with_marker() -> String {
    serde_json::json!({
        "model": "req-model",
        "messages": [{"role": "user", "content": format!("say {MARKER} back")}],
        "stream": true,
        "stream_options": {"include_usage": true},
    })
    .to_string()
}

/// Lines of `path` once it has `n` (the writer thread writes a moment after the request ends).
async fn lines(path: &std::path::Path, n: usize) -> Vec<String> {
    let mut text = String::new();
    for _ in 0..200 {
        text = std::fs::read_to_string(path).unwrap_or_default();
        if text.lines().count() >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    text.lines().map(str::to_owned).collect()
}

fn temp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tokenmeter-reqlog-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let p = dir.join(name);
    let _ = std::fs::remove_file(&p);
    p
}

#[tokio::test]
async fn n_requests_give_n_lines_each_field_exact_and_nothing_secret() {
    let _turn = crate::support::serial().await;
    let steps = vllm_steps();
    let expected = script_bytes(&steps);
    let up = upstream::spawn(move |_| Reply::sse(steps.clone())).await;
    let log = temp("exact.jsonl");
    let err = temp("exact.stderr");
    let stderr = std::fs::File::create(&err).expect("stderr file");
    let proxy = start(
        &up.url(),
        &["--request-log", log.to_str().expect("utf-8")],
        Stdio::null(),
        Stdio::from(stderr),
    )
    .await;
    const N: usize = 5;
    let auth = format!("Bearer {SECRET}");
    for i in 0..N {
        let rid = format!("req-{i}");
        let tp = format!("00-{TRACE_ID}-00f067aa0ba902b7-01");
        let mut headers = vec![("authorization", auth.as_str()), ("x-request-id", &rid)];
        if i % 2 == 0 {
            headers.push(("traceparent", &tp));
        }
        let (status, body) = post(
            &proxy.url("/v1/chat/completions?api-version=2024"),
            &chat_with_marker(),
            &headers,
        )
        .await;
        assert_eq!(status, 200);
        assert_eq!(body, expected, "the stream is byte-exact");
    }
    let got = lines(&log, N).await;
    proxy.stop();
    assert_eq!(got.len(), N, "{got:#?}");
    for (i, l) in got.iter().enumerate() {
        let v: Value = serde_json::from_str(l).expect("a JSON line");
        let s = |k: &str| v[k].as_str().map(str::to_owned);
        let n = |k: &str| v[k].as_f64();
        assert_eq!(s("request_id").as_deref(), Some(&*format!("req-{i}")));
        assert_eq!(s("method").as_deref(), Some("POST"));
        assert_eq!(s("path").as_deref(), Some("/v1/chat/completions"));
        assert_eq!(s("model").as_deref(), Some("test-model"));
        assert_eq!(v["tenant"], Value::Null);
        assert_eq!(s("class").as_deref(), Some("interactive"));
        assert_eq!(n("status"), Some(200.0));
        assert_eq!(s("outcome").as_deref(), Some("complete"));
        assert_eq!(s("api").as_deref(), Some("openai"));
        assert_eq!(n("input_tokens"), Some(12.0));
        assert_eq!(n("output_tokens"), Some(4.0));
        assert_eq!(n("cached_tokens"), Some(8.0));
        assert_eq!(s("token_source").as_deref(), Some("usage"));
        assert_eq!(s("stop").as_deref(), Some("length"));
        assert_eq!(s("engine_source").as_deref(), Some("vllm"));
        assert_eq!(n("engine_queue_seconds"), Some(0.0125));
        assert_eq!(n("engine_prefill_seconds"), Some(0.03));
        assert_eq!(n("engine_generation_seconds"), Some(0.04));
        assert_eq!(v["engine_model_load_seconds"], Value::Null);
        let ttft = n("ttft_seconds").expect("ttft");
        assert!(
            ttft >= TTFT.as_secs_f64() && ttft < TTFT.as_secs_f64() + TTFT_TOLERANCE,
            "ttft {ttft}"
        );
        let other = n("engine_other_seconds").expect("other");
        assert!((other - (ttft - 0.0425)).abs() < 1e-6, "{other} vs {ttft}");
        let duration = n("duration_seconds").expect("duration");
        assert!(duration >= ttft, "{duration} < {ttft}");
        assert!(n("tokens_per_second").expect("tps") > 0.0);
        let mean = n("concurrency").expect("concurrency");
        assert!((mean - 1.0).abs() < 1e-9, "one request at a time: {mean}");
        assert_eq!(s("concurrency_band").as_deref(), Some("1"));
        assert!(n("max_stall_seconds").expect("stall") >= 0.005);
        // The caller's trace id where it sent one; no span of ours without an exporter.
        let trace = (i % 2 == 0).then_some(TRACE_ID);
        assert_eq!(s("trace_id").as_deref(), trace);
        assert_eq!(v["span_id"], Value::Null);
        assert!(s("time").expect("time").ends_with('Z'));
    }
    let log_text = std::fs::read_to_string(&log).expect("log");
    let err_text = std::fs::read_to_string(&err).expect("stderr");
    // The per-request debug line carries the trace id too, to go from stderr to the trace.
    assert!(
        err_text.contains(TRACE_ID),
        "no trace id on stderr:\n{err_text}"
    );
    assert!(
        err_text.contains("request finished"),
        "debug on: {err_text}"
    );
    for (what, text) in [("log", &log_text), ("stderr", &err_text)] {
        for secret in [MARKER, SECRET, "api-version"] {
            assert!(!text.contains(secret), "{secret} in the {what}:\n{text}");
        }
    }
}

#[tokio::test]
async fn a_shed_request_has_its_line_too() {
    let _turn = crate::support::serial().await;
    let up = upstream::spawn(move |_| Reply::sse(vec![Step::Hang])).await;
    let log = temp("shed.jsonl");
    let proxy = start(
        &up.url(),
        &[
            "--request-log",
            log.to_str().expect("utf-8"),
            "--max-in-flight",
            "1",
        ],
        Stdio::null(),
        Stdio::null(),
    )
    .await;
    // One hanging stream holds the only place; the second request is shed.
    let url = proxy.url("/v1/chat/completions");
    let hold = tokio::spawn({
        let url = url.clone();
        async move { post(&url, &chat_with_marker(), &[]).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, _) = post(&url, &chat_with_marker(), &[("x-request-id", "shed-1")]).await;
    assert_eq!(status, 503);
    let got = lines(&log, 1).await;
    hold.abort();
    proxy.stop();
    assert_eq!(got.len(), 1, "{got:#?}");
    let v: Value = serde_json::from_str(&got[0]).expect("json");
    assert_eq!(v["outcome"], "shed");
    assert_eq!(v["status"], 503.0);
    assert_eq!(v["request_id"], "shed-1");
    assert_eq!(v["output_tokens"], Value::Null);
}

/// Resident memory of a process, in bytes (Linux).
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Growth of the resident memory allowed between the first and the last third of the run: the
/// queue's bound (about 2 MiB at most) with room for the allocator's own slack.
const RSS_GROWTH_MAX: u64 = 16 << 20;

#[tokio::test]
async fn a_log_on_a_pipe_nobody_reads_holds_no_stream_back_and_counts_its_drops() {
    let _turn = crate::support::serial().await;
    let steps = upstream::openai_chat(Duration::ZERO, 3, Duration::ZERO, true);
    let expected = script_bytes(&steps);
    let up = upstream::spawn(move |_| Reply::sse(steps.clone())).await;
    // stdout is a pipe this test holds open and never reads.
    let proxy = start(
        &up.url(),
        &["--request-log", "-"],
        Stdio::piped(),
        Stdio::null(),
    )
    .await;
    let pid = proxy.child.id();
    const TASKS: usize = 6;
    const REQUESTS: usize = 3 * TASKS * 166;
    let url = proxy.url("/v1/chat/completions");
    let mut rss_early = 0;
    for round in 0..3 {
        let mut tasks = Vec::new();
        for _ in 0..TASKS {
            let (url, expected) = (url.clone(), expected.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..REQUESTS / 3 / TASKS {
                    let (status, body) = post(&url, &client::chat_request(true, true), &[]).await;
                    assert_eq!(status, 200);
                    assert_eq!(body, expected, "the stream is byte-exact");
                }
            }));
        }
        for t in tasks {
            t.await.expect("client task");
        }
        if round == 0 {
            rss_early = rss(pid);
        }
    }
    let rss_late = rss(pid);
    let scrape = proxy.scrape().await;
    proxy.stop();
    let dropped = metric(names::REQUEST_LOG_DROPPED_TOTAL).value(&scrape);
    let done = REQUESTS as f64;
    println!(
        "{REQUESTS} requests: {dropped} lines dropped; resident {rss_early} -> {rss_late} bytes"
    );
    assert_eq!(metric(names::REQUESTS_TOTAL).sum(&scrape), done);
    // The pipe (64 KiB), the writer's buffer (64 KiB) and the queue (1,024 lines) hold at most
    // some 1,300 of the 2,988 lines: the rest were dropped and counted, none lost uncounted.
    assert!(dropped >= 1500.0, "dropped {dropped}");
    assert!(dropped < done, "dropped {dropped}");
    assert!(
        rss_late.saturating_sub(rss_early) < RSS_GROWTH_MAX,
        "resident memory grew from {rss_early} to {rss_late}"
    );
}

#[test]
fn a_log_file_that_cannot_be_opened_is_a_startup_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_tokenmeter"))
        .env_remove("TOKENMETER_UPSTREAM")
        .args([
            "--upstream",
            "http://127.0.0.1:1",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--gpus",
            "1",
            "--request-log",
            "/nonexistent-dir/requests.jsonl",
        ])
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("--request-log /nonexistent-dir/requests.jsonl: cannot open it"),
        "{err}"
    );
}

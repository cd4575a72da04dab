//! Tracing: W3C Trace Context followed and forwarded, and one span per request exported over
//! OTLP/HTTP, decoded by a receiver built on the OpenTelemetry protobuf definitions
//! (tests/otlp/receiver.py, Python's opentelemetry-proto).

use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};

use tokenmeter::metrics::names;

use crate::support::metrics::metric;
use crate::support::upstream::{self, script_bytes, Reply};
use crate::support::{client, spawn_proxy};

const MS: Duration = Duration::from_millis(1);
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// The Python interpreter with opentelemetry-proto that tests/run prepares, or `None` (a loud
/// skip; a failure in CI).
fn python_otlp() -> Option<String> {
    match std::env::var("TOKENMETER_OTLP_PYTHON") {
        Ok(p) if std::path::Path::new(&p).exists() => Some(p),
        _ => {
            assert!(
                !crate::support::in_ci(),
                "TOKENMETER_OTLP_PYTHON is not set: tests/run prepares it"
            );
            crate::support::skip(
                &crate::support::current_test(),
                "no TOKENMETER_OTLP_PYTHON (run tests/run, which prepares it, or set it)",
            );
            None
        }
    }
}

/// The receiver, running, and the lines it prints.
struct Receiver {
    _child: Child,
    lines: tokio::io::Lines<BufReader<ChildStdout>>,
    port: u16,
}

impl Receiver {
    async fn start(python: &str) -> Receiver {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/otlp/receiver.py");
        let mut child = Command::new(python)
            .arg(script)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the receiver");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let first = lines
            .next_line()
            .await
            .expect("read")
            .expect("a first line");
        let port = first
            .strip_prefix("listening ")
            .and_then(|p| p.parse().ok())
            .expect("listening PORT");
        Receiver {
            _child: child,
            lines,
            port,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The next span the receiver decoded (the exporter batches for up to a second).
    async fn span(&mut self) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(10), self.lines.next_line())
            .await
            .expect("a span within 10 s")
            .expect("read")
            .expect("a line");
        serde_json::from_str(&line).expect("json")
    }
}

async fn post(url: &str, headers: &[(&str, &str)]) -> (u16, Vec<u8>) {
    let mut req = http::Request::builder()
        .method(http::Method::POST)
        .uri(url)
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(Bytes::from(client::chat_request(true, true))))
        .expect("request");
    let resp = client::client().request(req).await.expect("response");
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, body.to_vec())
}

/// The `traceparent` the upstream received on its `i`th request.
fn upstream_traceparent(up: &upstream::Upstream, i: usize) -> Option<String> {
    let received = up.received.lock().expect("lock");
    received[i]
        .headers
        .iter()
        .find(|(k, _)| k == "traceparent")
        .map(|(_, v)| v.clone())
}

#[tokio::test]
async fn a_sampled_caller_gets_one_span_in_its_trace_and_the_upstream_our_span_as_parent() {
    let Some(python) = python_otlp() else { return };
    let mut rx = Receiver::start(&python).await;
    let steps = upstream::openai_chat(20 * MS, 5, 2 * MS, true);
    let expected = script_bytes(&steps);
    let up = upstream::spawn(move |_| Reply::sse(steps.clone())).await;
    let proxy = spawn_proxy(&up.url(), &["--otlp-endpoint", &rx.url()]).await;
    let tp = format!("00-{TRACE_ID}-{CALLER_SPAN}-01");
    let (status, body) = post(
        &format!("{}/v1/chat/completions", proxy.url()),
        &[
            ("traceparent", &tp),
            ("tracestate", "congo=t61rcWkgMzE"),
            ("x-request-id", "r-1"),
        ],
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body, expected);
    let span = rx.span().await;
    assert_eq!(span["trace_id"], TRACE_ID);
    assert_eq!(span["parent_span_id"], CALLER_SPAN);
    assert_eq!(span["trace_state"], "congo=t61rcWkgMzE");
    assert_eq!(span["name"], "chat req-model");
    assert_eq!(span["kind"], 2, "SPAN_KIND_SERVER");
    assert_eq!(span["content_type"], "application/x-protobuf");
    assert_eq!(span["resource"]["service.name"], "tokenmeter");
    let a = &span["attributes"];
    assert_eq!(a["gen_ai.operation.name"], "chat");
    assert_eq!(a["gen_ai.request.model"], "req-model");
    assert_eq!(a["gen_ai.response.model"], "test-model");
    // protobuf's JSON-less decoding gives int64 as Python ints.
    assert_eq!(a["gen_ai.usage.input_tokens"], 12);
    assert_eq!(a["gen_ai.usage.output_tokens"], 5);
    assert_eq!(a["http.response.status_code"], 200);
    assert_eq!(a["tokenmeter.outcome"], "complete");
    assert_eq!(a["tokenmeter.request_id"], "r-1");
    assert_eq!(a["tokenmeter.token_source"], "usage");
    assert_eq!(a["server.address"], proxy.addr.to_string());
    assert!(a["tokenmeter.ttft_seconds"].as_f64().expect("ttft") >= 0.020);
    let events: Vec<&str> = span["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["name"].as_str().expect("name"))
        .collect();
    assert_eq!(events, ["gen_ai.first_token", "gen_ai.first_content_token"]);
    assert_eq!(span["status"]["code"], 0, "unset: no failure");
    // The upstream got our span as its parent, in the caller's trace.
    let sent = upstream_traceparent(&up, 0).expect("a traceparent upstream");
    let our_span = span["span_id"].as_str().expect("span id");
    assert_eq!(sent, format!("00-{TRACE_ID}-{our_span}-01"));
    assert_ne!(our_span, CALLER_SPAN);
    let scrape = proxy.settled(1.0).await;
    assert_eq!(metric(names::TRACE_SPANS_DROPPED_TOTAL).value(&scrape), 0.0);
}

#[tokio::test]
async fn without_a_traceparent_sample_1_starts_a_trace_and_0_forwards_nothing() {
    let Some(python) = python_otlp() else { return };
    let mut rx = Receiver::start(&python).await;
    let steps = upstream::openai_chat(MS, 2, MS, true);
    let up = upstream::spawn(move |_| Reply::sse(steps.clone())).await;
    let url = rx.url();
    let proxy = spawn_proxy(&up.url(), &["--otlp-endpoint", &url, "--trace-sample", "1"]).await;
    let (status, _) = post(&format!("{}/v1/chat/completions", proxy.url()), &[]).await;
    assert_eq!(status, 200);
    let span = rx.span().await;
    let trace = span["trace_id"].as_str().expect("trace id");
    assert_eq!(trace.len(), 32);
    assert_ne!(trace, "0".repeat(32));
    assert_eq!(span["parent_span_id"], "", "a root span");
    let sent = upstream_traceparent(&up, 0).expect("a traceparent upstream");
    assert_eq!(
        sent,
        format!("00-{trace}-{}-01", span["span_id"].as_str().expect("id"))
    );

    // The default: no new traces, and a caller's unsampled header goes on unchanged.
    let quiet = spawn_proxy(&up.url(), &["--otlp-endpoint", &url]).await;
    let (status, _) = post(&format!("{}/v1/chat/completions", quiet.url()), &[]).await;
    assert_eq!(status, 200);
    assert_eq!(upstream_traceparent(&up, 1), None);
    let unsampled = format!("00-{TRACE_ID}-{CALLER_SPAN}-00");
    let url = format!("{}/v1/chat/completions", quiet.url());
    let (status, _) = post(&url, &[("traceparent", &unsampled)]).await;
    assert_eq!(status, 200);
    assert_eq!(upstream_traceparent(&up, 2).as_deref(), Some(&*unsampled));
    let s = quiet.settled(2.0).await;
    assert_eq!(metric(names::TRACE_SPANS_DROPPED_TOTAL).value(&s), 0.0);
}

#[tokio::test]
async fn a_failed_request_has_an_error_status() {
    let Some(python) = python_otlp() else { return };
    let mut rx = Receiver::start(&python).await;
    let up = upstream::spawn(|_| Reply::json(500, r#"{"error":"boom"}"#)).await;
    let url = rx.url();
    let proxy = spawn_proxy(&up.url(), &["--otlp-endpoint", &url, "--trace-sample", "1"]).await;
    let (status, _) = post(&format!("{}/v1/chat/completions", proxy.url()), &[]).await;
    assert_eq!(status, 500);
    let span = rx.span().await;
    assert_eq!(span["status"]["code"], 2, "STATUS_CODE_ERROR");
    assert_eq!(span["status"]["message"], "status 500");
    assert_eq!(span["attributes"]["http.response.status_code"], 500);
    // Nothing listens upstream: the proxy's own 502, outcome upstream_error.
    let gone = spawn_proxy(
        "http://127.0.0.1:1",
        &["--otlp-endpoint", &url, "--trace-sample", "1"],
    )
    .await;
    let (status, _) = post(&format!("{}/v1/chat/completions", gone.url()), &[]).await;
    assert_eq!(status, 502);
    let span = rx.span().await;
    assert_eq!(span["status"]["code"], 2);
    assert_eq!(span["status"]["message"], "upstream_error");
    assert_eq!(span["attributes"]["tokenmeter.outcome"], "upstream_error");
}

#[tokio::test]
async fn a_dead_collector_holds_no_stream_back_and_its_spans_are_counted_as_dropped() {
    // A port nothing listens on: every export is refused.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr");
    let steps = upstream::openai_chat(Duration::ZERO, 3, Duration::ZERO, true);
    let expected = script_bytes(&steps);
    let up = upstream::spawn(move |_| Reply::sse(steps.clone())).await;
    let endpoint = format!("http://{dead}");
    let proxy = spawn_proxy(
        &up.url(),
        &["--otlp-endpoint", &endpoint, "--trace-sample", "1"],
    )
    .await;
    const N: usize = 50;
    for _ in 0..N {
        let (status, body) = post(&format!("{}/v1/chat/completions", proxy.url()), &[]).await;
        assert_eq!(status, 200);
        assert_eq!(body, expected, "byte-exact");
    }
    let scrape = proxy
        .eventually(|s| metric(names::TRACE_SPANS_DROPPED_TOTAL).value(s) >= N as f64)
        .await;
    assert_eq!(
        metric(names::TRACE_SPANS_DROPPED_TOTAL).value(&scrape),
        N as f64,
        "every span of the {N} requests dropped and counted once"
    );
}

#[tokio::test]
async fn a_collector_that_never_answers_bounds_the_queue_and_counts_the_rest() {
    let _turn = crate::support::serial().await;
    // Connects hang: the export task holds one batch (at most 512 spans) for its 10 s timeout
    // while the queue (2,048) fills; every span beyond them is dropped at once, and counted.
    let hole = upstream::black_hole().await;
    let steps = upstream::openai_chat(Duration::ZERO, 2, Duration::ZERO, true);
    let expected = script_bytes(&steps);
    let up = upstream::spawn(move |_| Reply::sse(steps.clone())).await;
    let endpoint = format!("http://{}", hole.addr);
    let proxy = spawn_proxy(
        &up.url(),
        &["--otlp-endpoint", &endpoint, "--trace-sample", "1"],
    )
    .await;
    const TASKS: usize = 6;
    const N: usize = TASKS * 500;
    let url = format!("{}/v1/chat/completions", proxy.url());
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (url, expected) = (url.clone(), expected.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..N / TASKS {
                let (status, body) = post(&url, &[]).await;
                assert_eq!(status, 200);
                assert_eq!(body, expected, "byte-exact");
            }
        }));
    }
    for t in tasks {
        t.await.expect("client task");
    }
    let scrape = proxy.settled(N as f64).await;
    let dropped = metric(names::TRACE_SPANS_DROPPED_TOTAL).value(&scrape);
    println!("{N} requests against a black-holed collector: {dropped} spans dropped");
    // Held at most: the queue and the one batch in flight.
    assert!(
        dropped >= (N - 2048 - 512) as f64,
        "dropped {dropped}: more than the queue and one batch were held"
    );
    assert!(dropped <= N as f64, "dropped {dropped}");
}

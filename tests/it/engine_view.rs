//! The engine's own view (`--engine-metrics`): read from a real simulator's `/metrics`, and
//! held to its bounds by engines that hang, answer garbage or answer 50 MB.
//!
//! Every case reads the page from the same upstream the streams go to (`auto`), every 200 ms
//! (`--engine-metrics-interval`), and waits for a condition on tokenmeter's own `/metrics`,
//! never for a time.

use std::time::{Duration, Instant};

use bytes::Bytes;

use tokenmeter::metrics::names;

use crate::support::metrics::metric;
use crate::support::process::Binary;
use crate::support::upstream::{self, Reply, Step};
use crate::support::{client, spawn_proxy, start_sim};
use tokenmeter_tools::sim::kv::KvConfig;
use tokenmeter_tools::sim::SimConfig;

/// The longest a condition may take to come true: reads every 200 ms, so a few hundred ms here;
/// a busy 2-core machine may be slower by far, and only a failure waits this long.
const DEADLINE: Duration = Duration::from_secs(60);

async fn get(url: &str) -> String {
    client::get_text(url).await
}

/// Polls `url` until `f` holds; panics with the last page at the deadline.
async fn until(url: &str, what: &str, f: impl Fn(&str) -> bool) -> String {
    let start = Instant::now();
    loop {
        let page = get(url).await;
        if f(&page) {
            return page;
        }
        assert!(start.elapsed() < DEADLINE, "{what} never came:\n{page}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulators_cache_reaches_the_capacity_model() {
    let sim = start_sim(SimConfig {
        kv: Some(KvConfig {
            tokens: 2048,
            block_size: 128,
        }),
        ..SimConfig::default()
    })
    .await;
    let proxy = spawn_proxy(
        &format!("http://{sim}"),
        &[
            "--engine-metrics",
            "auto",
            "--engine-metrics-interval",
            "200ms",
        ],
    )
    .await;
    let start = Instant::now();
    let page = loop {
        // The capacity model takes the engine's word at its next refit: ask for one now.
        proxy.capacity.next_report().await;
        let page = proxy.scrape().await;
        if metric(names::capacity::KV_CACHE_TOKENS).sum_or_zero_if_absent(&page) > 0.0 {
            break page;
        }
        assert!(start.elapsed() < DEADLINE, "no cache size:\n{page}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        metric(names::engine_view::KV_CACHE_TOKENS).value(&page),
        2048.0
    );
    assert_eq!(
        metric(names::capacity::KV_CACHE_TOKENS).value(&page),
        2048.0
    );
    assert_eq!(metric(names::engine_view::KV_CACHE_USAGE).value(&page), 0.0);
    assert_eq!(
        metric(names::engine_view::REQUESTS_RUNNING).value(&page),
        0.0
    );
    assert!(
        metric(names::engine_view::SCRAPES)
            .label("result", "ok")
            .value(&page)
            >= 1.0
    );
    // The flags win over the engine.
    let flagged = spawn_proxy(
        &format!("http://{sim}"),
        &[
            "--engine-metrics",
            "auto",
            "--engine-metrics-interval",
            "200ms",
            "--kv-cache-tokens",
            "4096",
        ],
    )
    .await;
    let _ = flagged
        .eventually(|p| metric(names::engine_view::KV_CACHE_TOKENS).sum_or_zero_if_absent(p) > 0.0)
        .await;
    flagged.capacity.next_report().await;
    let page = flagged.scrape().await;
    assert_eq!(
        metric(names::engine_view::KV_CACHE_TOKENS).value(&page),
        2048.0
    );
    assert_eq!(
        metric(names::capacity::KV_CACHE_TOKENS).value(&page),
        4096.0
    );
}

/// The SSE body every stream gets, in pieces.
fn stream_steps() -> (Vec<Step>, Vec<u8>) {
    let mut body = Vec::new();
    let mut steps = Vec::new();
    for i in 0..20 {
        let event = format!(
            "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i} \"}}}}]}}\n\n"
        );
        body.extend_from_slice(event.as_bytes());
        steps.push(Step::Send(Bytes::from(event)));
        steps.push(Step::Sleep(Duration::from_millis(5)));
    }
    body.extend_from_slice(b"data: [DONE]\n\n");
    steps.push(Step::Send(Bytes::from_static(b"data: [DONE]\n\n")));
    (steps, body)
}

/// An engine whose `/metrics` is `page`; streams go through a separate proxy process, and one
/// stream must arrive byte for byte while the engine misbehaves. Returns the proxy's page once
/// `result` was counted, and the proxy.
async fn misbehaving(page: fn() -> Reply, result: &str) -> (String, Binary) {
    let (steps, body) = stream_steps();
    let up = upstream::spawn(move |r| {
        if r.path == "/metrics" {
            page()
        } else {
            Reply::sse(steps.clone())
        }
    })
    .await;
    let proxy = Binary::start(
        &up.url(),
        &[
            "--engine-metrics",
            "auto",
            "--engine-metrics-interval",
            "200ms",
        ],
    );
    let metrics = format!("http://{}/metrics", proxy.metrics_addr);
    let counted = until(&metrics, result, |p| {
        metric(names::engine_view::SCRAPES)
            .label("result", result)
            .sum_or_zero_if_absent(p)
            >= 1.0
    })
    .await;
    let seen = client::post(
        &format!("{}/v1/chat/completions", proxy.url()),
        &client::chat_request(true, false),
    )
    .await;
    assert_eq!(seen.status, 200);
    assert!(!seen.error);
    assert_eq!(
        seen.body, body,
        "the stream changed while the engine's page was {result}"
    );
    // No figure is made up from a page that said nothing, and the model has no cache size.
    assert!(
        metric(names::engine_view::KV_CACHE_TOKENS).is_absent(&counted),
        "{counted}"
    );
    (counted, proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_hangs_is_given_up_on_and_counted() {
    let (_, _proxy) = misbehaving(
        || Reply {
            head_delay: Duration::from_secs(3600),
            ..Reply::sse(vec![])
        },
        "timeout",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_answers_garbage_says_nothing() {
    let (_, _proxy) = misbehaving(
        || Reply::json(200, "<html><body>\u{0}\u{1} vllm? {{{ not a metric page"),
        "unknown_dialect",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_answers_fifty_megabytes_is_read_no_further_than_the_limit() {
    fn huge() -> Reply {
        // 50 MB of a valid-looking page, in 1 MB pieces.
        let line = "vllm:num_requests_running{model_name=\"m\",padding=\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"} 1\n";
        let piece = Bytes::from(line.repeat((1 << 20) / line.len()));
        Reply {
            headers: vec![("content-type".into(), "text/plain".into())],
            ..Reply::sse((0..50).map(|_| Step::Send(piece.clone())).collect())
        }
    }
    let (page, proxy) = misbehaving(huge, "too_large").await;
    // Keep it reading for a few more intervals, then hold the peak: 50 MB read in full (let
    // alone parsed) would show; the 4 MiB limit and its parse stay far below.
    let metrics = format!("http://{}/metrics", proxy.metrics_addr);
    let before = metric(names::engine_view::SCRAPES)
        .label("result", "too_large")
        .sum_or_zero_if_absent(&page);
    until(&metrics, "more reads", |p| {
        metric(names::engine_view::SCRAPES)
            .label("result", "too_large")
            .sum_or_zero_if_absent(p)
            >= before + 3.0
    })
    .await;
    let peak = proxy.peak_rss();
    eprintln!(
        "peak RSS {} MiB after reading a 50 MB page {} times",
        peak >> 20,
        before + 3.0
    );
    assert!(
        peak < 48 << 20,
        "peak RSS {} MiB while reading a 50 MB page",
        peak >> 20
    );
}

/// An engine that states its limits in a JSON document beside its page: the capacity model and
/// the engine gauges take them from there. `page` is its `/metrics` (`None`: it answers 501, as
/// llama.cpp does without `--metrics`), `doc` the document at `path`.
async fn stated_beside(
    page: Option<&'static str>,
    path: &'static str,
    doc: &'static str,
) -> String {
    let up = upstream::spawn(move |r| match (r.path.as_str(), page) {
        ("/metrics", Some(page)) => Reply::json(200, page),
        ("/metrics", None) => Reply::json(501, r#"{"error":"metrics not enabled"}"#),
        (p, _) if p == path => Reply::json(200, doc),
        _ => Reply::json(404, "{}"),
    })
    .await;
    let proxy = spawn_proxy(
        &up.url(),
        &[
            "--engine-metrics",
            "auto",
            "--engine-metrics-interval",
            "200ms",
        ],
    )
    .await;
    let start = Instant::now();
    loop {
        proxy.capacity.next_report().await;
        let page = proxy.scrape().await;
        if metric(names::capacity::KV_CACHE_TOKENS).sum_or_zero_if_absent(&page) > 0.0 {
            let memory = proxy.capacity.memory();
            return format!(
                "{page}\n# memory {:?} {} {:?}",
                memory.kv_cache_tokens, memory.block_size, memory.max_num_seqs
            );
        }
        assert!(start.elapsed() < DEADLINE, "no cache size:\n{page}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tgi_states_its_cache_on_info() {
    let page = stated_beside(
        Some("tgi_batch_current_size 3\ntgi_queue_size 2\ntgi_batch_current_max_tokens 12996\n"),
        "/info",
        r#"{"model_id":"m","max_concurrent_requests":128,"max_batch_total_tokens":51984,"max_batch_size":24,"block_size":16,"version":"3.0.1"}"#,
    )
    .await;
    for (name, want) in [
        ("tokenmeter_engine_kv_cache_tokens", 51984.0),
        ("tokenmeter_engine_requests_running", 3.0),
        ("tokenmeter_engine_requests_waiting", 2.0),
        // The running batch reserved 12,996 of 51,984 tokens.
        ("tokenmeter_engine_kv_cache_usage_ratio", 0.25),
    ] {
        assert_eq!(metric(name).value(&page), want, "{name}");
    }
    assert!(
        page.ends_with("# memory Some(51984) 16 Some(24)"),
        "{}",
        page.lines().last().unwrap_or_default()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llamacpp_without_metrics_states_its_slots_on_props() {
    let page = stated_beside(
        None,
        "/props",
        r#"{"default_generation_settings":{"id":0,"n_ctx":2048,"params":{}},"total_slots":4,"build_info":"b5000"}"#,
    )
    .await;
    assert_eq!(
        metric(names::engine_view::KV_CACHE_TOKENS).value(&page),
        8192.0
    );
    assert!(
        page.ends_with("# memory Some(8192) 1 Some(4)"),
        "{}",
        page.lines().last().unwrap_or_default()
    );
}

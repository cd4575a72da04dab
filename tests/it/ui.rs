//! The page on the metrics listener: `/api/summary` agrees with `/metrics`, the page is served
//! there and never on the proxy port, and `--no-ui` turns it off.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use tokenmeter::metrics::names;

use crate::support::client::{self, chat_request, get_text};
use crate::support::metrics::metric;
use crate::support::upstream::{self, Reply};
use crate::support::{serial, spawn_proxy};

const MS: Duration = Duration::from_millis(1);

/// TTFTs (ms) and output lengths the upstream cycles through, so the percentiles span buckets.
const TTFT_MS: [u32; 6] = [3, 12, 30, 55, 90, 240];
const TOKENS: [usize; 4] = [5, 9, 17, 30];

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("{v} is not a number"))
}

fn close(a: f64, b: f64, what: &str) {
    assert!(
        (a - b).abs() <= 1e-9 * b.abs().max(1.0),
        "{what}: summary {a}, /metrics {b}"
    );
}

#[tokio::test]
async fn api_summary_agrees_with_metrics_over_the_same_window() {
    let _turn = serial().await;
    let n = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&n);
    let up = upstream::spawn(move |_| {
        let i = counter.fetch_add(1, Ordering::SeqCst);
        Reply::sse(upstream::openai_chat(
            TTFT_MS[i % TTFT_MS.len()] * MS,
            TOKENS[i % TOKENS.len()],
            2 * MS,
            i % 3 != 0,
        ))
    })
    .await;
    // A long rate window keeps the aggregate gauge still once the traffic stops, so the two
    // readings below see the same value.
    let proxy = spawn_proxy(
        &up.url(),
        &[
            "--gpus",
            "2",
            "--rate-window",
            "10m",
            "--ui-sample-period",
            "1s",
        ],
    )
    .await;
    let url = format!("{}/v1/chat/completions", proxy.url());
    let body = chat_request(true, true);
    // 24 requests, 1 then 6 at a time: two concurrency bands.
    for _ in 0..6 {
        client::post(&url, &body).await;
    }
    for _ in 0..3 {
        let tasks: Vec<_> = (0..6)
            .map(|_| {
                let (url, body) = (url.clone(), body.clone());
                tokio::spawn(async move { client::post(&url, &body).await })
            })
            .collect();
        for t in tasks {
            assert_eq!(t.await.expect("join").status, 200);
        }
    }
    let scrape = proxy.settled(24.0).await;
    // Let the sampler take a reading or two of the settled registry.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let text = get_text(&format!("http://{}/api/summary", proxy.metrics_addr)).await;
    let s: Value = serde_json::from_str(&text).expect("summary is JSON");
    assert_eq!(
        proxy
            .scrape()
            .await
            .lines()
            .filter(|l| l.contains("_count"))
            .count(),
        scrape.lines().filter(|l| l.contains("_count")).count(),
        "nothing moved meanwhile"
    );

    // The window: the process is younger than a minute, so it runs from the start.
    let start = metric(names::START_TIME_SECONDS).value(&scrape);
    assert_eq!(f(&s["now"]["window"]["from_unix_ms"]), start * 1000.0);
    let now = &s["now"];
    let ttft = "tokenmeter_time_to_first_token_seconds";
    close(
        f(&now["ttft_p50_seconds"]),
        metric(ttft).quantile(0.5, &scrape),
        "TTFT p50",
    );
    close(
        f(&now["ttft_p99_seconds"]),
        metric(ttft).quantile(0.99, &scrape),
        "TTFT p99",
    );
    assert_eq!(
        f(&now["ttft_requests"]),
        metric(&format!("{ttft}_count")).sum(&scrape)
    );
    assert_eq!(f(&now["ttft_requests"]), 24.0);
    let tps = "tokenmeter_request_tokens_per_second";
    close(
        f(&now["request_tokens_per_second_p50"]),
        metric(tps).quantile(0.5, &scrape),
        "per-request p50",
    );
    let rate = metric(names::OUTPUT_TOKENS_PER_SECOND).value(&scrape);
    assert!(rate > 0.0);
    assert_eq!(f(&now["output_tokens_per_second"]), rate);
    assert_eq!(
        f(&now["output_tokens_per_second_per_gpu"]),
        metric(names::OUTPUT_TOKENS_PER_SECOND_PER_GPU).value(&scrape)
    );
    assert_eq!(f(&now["gpus"]), 2.0);
    assert_eq!(
        f(&now["in_flight_decode"]) + f(&now["in_flight_prefill"]),
        0.0
    );

    // Per band, since start: the same histogram read per `concurrency` label.
    let bands = s["tradeoff"]["bands"].as_array().expect("bands");
    let mut requests = 0.0;
    for b in bands {
        let band = b["band"].as_str().expect("band");
        let count = metric(&format!("{tps}_count"))
            .label("concurrency", band)
            .sum(&scrape);
        assert_eq!(f(&b["requests"]), count, "band {band}");
        requests += count;
        if count > 0.0 {
            close(
                f(&b["per_request_p50"]),
                metric(tps)
                    .label("concurrency", band)
                    .quantile(0.5, &scrape),
                &format!("band {band} p50"),
            );
        }
    }
    assert_eq!(requests, 24.0);
    assert!(bands.len() >= 2, "two bands measured: {bands:?}");

    // Counts since start.
    let total = metric(names::REQUESTS_TOTAL).sum(&scrape);
    assert_eq!(f(&s["totals"]["requests"]), total);
    assert_eq!(
        f(&s["totals"]["output_tokens"]),
        metric(names::OUTPUT_TOKENS_TOTAL).sum(&scrape)
    );
    for o in s["outcomes"].as_array().expect("outcomes") {
        let name = o["name"].as_str().expect("name");
        let want = metric(names::REQUESTS_TOTAL)
            .label("outcome", name)
            .sum(&scrape);
        assert_eq!(f(&o["requests"]), want, "outcome {name}");
    }
    for o in s["token_sources"].as_array().expect("sources") {
        let name = o["name"].as_str().expect("name");
        let want = metric(names::TOKEN_COUNT_SOURCE_TOTAL)
            .label("source", name)
            .sum(&scrape);
        assert_eq!(f(&o["requests"]), want, "source {name}");
    }
    // The sampler ran: readings, and the last ones saw the settled registry.
    let history = s["history"].as_array().expect("history");
    assert!(!history.is_empty(), "no reading in 1.5 s at a 1 s period");
    let last = history.last().expect("a reading");
    assert_eq!(f(&last["in_flight_decode"]), 0.0);
}

#[tokio::test]
async fn the_page_is_on_the_metrics_port_only_and_no_ui_turns_it_off() {
    let up = upstream::spawn(|r| Reply::json(200, &format!("{{\"path\":\"{}\"}}", r.path))).await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    let page = client::send(
        http::Method::GET,
        &format!("http://{}/", proxy.metrics_addr),
        "",
    )
    .await;
    assert_eq!(page.status, 200);
    assert!(page.headers["content-type"]
        .to_str()
        .expect("ascii")
        .starts_with("text/html"));
    assert!(String::from_utf8_lossy(&page.body).contains("<title>tokenmeter</title>"));
    let js = client::send(
        http::Method::GET,
        &format!("http://{}/ui.js", proxy.metrics_addr),
        "",
    )
    .await;
    assert_eq!(js.status, 200);
    // On the proxy port, / is the upstream's.
    let fwd = client::send(http::Method::GET, &format!("{}/", proxy.url()), "").await;
    assert_eq!(fwd.body, br#"{"path":"/"}"#);
    assert_eq!(up.received.lock().expect("lock").len(), 1);

    let off = spawn_proxy(&up.url(), &["--no-ui"]).await;
    for path in ["/", "/api/summary", "/ui.js"] {
        let r = client::send(
            http::Method::GET,
            &format!("http://{}{path}", off.metrics_addr),
            "",
        )
        .await;
        assert_eq!(r.status, 404, "{path} with --no-ui");
    }
    let m = client::send(
        http::Method::GET,
        &format!("http://{}/metrics", off.metrics_addr),
        "",
    )
    .await;
    assert_eq!(m.status, 200);
}

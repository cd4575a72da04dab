//! SLO classes through real sockets: crafted streams from a scripted upstream give exactly each
//! `result` of `tokenmeter_slo_requests_total`, and goodput counts exactly the tokens of the
//! requests that met their targets.
//!
//! Timing margins: every target is at least 2.5x away from what the script does (a 300 ms TTFT
//! target against 10 ms or 800 ms, a 20 tokens/s floor against 100 or 6.7 tokens/s), so a
//! loaded machine that delays a step by a hundred milliseconds does not change a result.

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};

use tokenmeter::metrics::names;

use crate::support::client::{chat_request, client};
use crate::support::metrics::metric;
use crate::support::spawn_proxy;
use crate::support::upstream::{self, Received, Reply, Step};

const MS: Duration = Duration::from_millis(1);

/// The classes every test here runs with.
const CLASSES: [&str; 6] = [
    "--slo",
    "fast:ttft=300ms,tps=20,objective=0.9",
    "--slo",
    "quick:e2e=1s",
    "--slo",
    "batch",
];

/// What the scripted upstream does, chosen by the request's `case` query parameter.
fn script(r: &Received) -> Reply {
    let case = r.path.split("case=").nth(1).unwrap_or("met");
    match case {
        // 20 tokens at 100 tokens/s after 10 ms.
        "met" => Reply::sse(upstream::openai_chat(10 * MS, 20, 10 * MS, true)),
        "slow_first" => Reply::sse(upstream::openai_chat(800 * MS, 5, 10 * MS, true)),
        // 10 tokens 150 ms apart: 6.7 tokens/s.
        "slow_decode" => Reply::sse(upstream::openai_chat(10 * MS, 10, 150 * MS, true)),
        // 60 tokens 25 ms apart: 40 tokens/s, 1.5 s in all.
        "long" => Reply::sse(upstream::openai_chat(10 * MS, 60, 25 * MS, true)),
        // One token: no decode window.
        "one" => Reply::sse(upstream::openai_chat(10 * MS, 1, MS, true)),
        // 8 tokens 40 ms apart after 200 ms: 25 tokens/s.
        "steady" => Reply::sse(upstream::openai_chat(200 * MS, 8, 40 * MS, true)),
        "status500" => Reply::json(500, r#"{"error":{"message":"boom"}}"#),
        "cut" => {
            let mut steps = upstream::openai_chat(10 * MS, 10, 10 * MS, false);
            steps.truncate(8);
            steps.push(Step::Abort);
            Reply::sse(steps)
        }
        "prefill_forever" => {
            let mut r = Reply::sse(upstream::openai_chat(MS, 2, MS, false));
            r.head_delay = Duration::from_secs(5);
            r
        }
        other => panic!("unknown case {other}"),
    }
}

/// POSTs a streaming chat request for `case` with extra headers and reads the whole response.
async fn send(proxy_url: &str, case: &str, headers: &[(&str, &str)]) -> u16 {
    send_to(
        proxy_url,
        &format!("/v1/chat/completions?case={case}"),
        headers,
    )
    .await
}

/// The same, to any path.
async fn send_to(proxy_url: &str, path: &str, headers: &[(&str, &str)]) -> u16 {
    let mut req = http::Request::builder()
        .method(http::Method::POST)
        .uri(format!("{proxy_url}{path}"))
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(Bytes::from(chat_request(true, true))))
        .expect("request");
    let resp = client().request(req).await.expect("response");
    let status = resp.status().as_u16();
    let _ = resp.into_body().collect().await;
    status
}

/// Sends a request on a raw connection and closes it after `after`, before any response.
async fn hang_up(addr: std::net::SocketAddr, case: &str, class: &str, after: Duration) {
    let case = case.to_string();
    let class = class.to_string();
    tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(addr).expect("connect");
        let body = chat_request(true, false);
        write!(
            s,
            "POST /v1/chat/completions?case={case} HTTP/1.1\r\nhost: x\r\nx-tokenmeter-class: {class}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("write");
        std::thread::sleep(after);
    })
    .await
    .expect("client");
}

fn slo(scrape: &str, class: &str, result: &str) -> f64 {
    metric(names::SLO_REQUESTS_TOTAL)
        .label("class", class)
        .label("result", result)
        .sum(scrape)
}

#[tokio::test]
async fn crafted_streams_give_each_result_and_goodput_counts_only_met_tokens() {
    let _turn = crate::support::serial().await;
    let up = upstream::spawn(script).await;
    let proxy = spawn_proxy(&up.url(), &CLASSES).await;
    let url = proxy.url();
    let fast = [("x-tokenmeter-class", "fast")];
    assert_eq!(send(&url, "met", &fast).await, 200);
    assert_eq!(send(&url, "met", &fast).await, 200);
    assert_eq!(send(&url, "slow_first", &fast).await, 200);
    assert_eq!(send(&url, "slow_decode", &fast).await, 200);
    assert_eq!(send(&url, "one", &fast).await, 200);
    assert_eq!(
        send(&url, "long", &[("x-tokenmeter-class", "quick")]).await,
        200
    );
    assert_eq!(send(&url, "status500", &fast).await, 500);
    assert_eq!(send(&url, "cut", &fast).await, 200);
    // The client leaves after 100 ms, before the 300 ms TTFT target could be missed ...
    hang_up(proxy.addr, "prefill_forever", "fast", 100 * MS).await;
    // ... and after 1 s without a token: that user was failed, not impatient.
    hang_up(proxy.addr, "prefill_forever", "fast", 1000 * MS).await;
    let s = proxy.settled(10.0).await;

    for (result, n) in [
        ("met", 3.0),
        ("ttft_missed", 2.0),
        ("tps_missed", 1.0),
        ("e2e_missed", 0.0),
        ("error", 2.0),
        ("client_disconnect", 1.0),
    ] {
        assert_eq!(slo(&s, "fast", result), n, "fast/{result} in\n{s}");
    }
    assert_eq!(slo(&s, "quick", "e2e_missed"), 1.0, "{s}");
    assert_eq!(metric(names::SLO_REQUESTS_TOTAL).sum(&s), 10.0, "{s}");
    // Goodput: the two 20-token streams and the 1-token one; nothing from the misses.
    assert_eq!(
        metric(names::GOODPUT_OUTPUT_TOKENS_TOTAL)
            .label("class", "fast")
            .label("model", "test-model")
            .value(&s),
        41.0,
        "{s}"
    );
    assert_eq!(
        metric(names::GOODPUT_OUTPUT_TOKENS_TOTAL)
            .label("class", "quick")
            .sum(&s),
        0.0
    );
    // One request at a time: every result is in band 1.
    assert_eq!(
        metric(names::SLO_REQUESTS_TOTAL)
            .label("concurrency", "1")
            .sum(&s),
        10.0,
        "{s}"
    );
    for (class, objective) in [("fast", 0.9), ("quick", 0.95), ("batch", 0.95)] {
        assert_eq!(
            metric(names::SLO_OBJECTIVE).label("class", class).value(&s),
            objective
        );
    }
}

#[tokio::test]
async fn classes_come_from_header_path_and_model_and_unknown_names_add_no_label() {
    let dir = std::env::temp_dir().join(format!("tokenmeter-slo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("slo.yaml");
    std::fs::write(
        &file,
        "classes:\n  - {name: interactive, ttft: 1s, tps: 20}\n  - {name: batch}\n  - {name: agent}\n\
         rules:\n  - {path_prefix: /v1/batches, class: batch}\n\
         \x20 - {model: req-model, class: agent}\n",
    )
    .expect("write");
    let up = upstream::spawn(script).await;
    let flags = ["--slo-file", file.to_str().expect("utf-8 path")];
    let proxy = spawn_proxy(&up.url(), &flags).await;
    let url = proxy.url();
    send(&url, "met", &[("x-tokenmeter-class", "batch")]).await;
    send(&url, "met", &[("x-tokenmeter-class", "no-such-class")]).await;
    // No header: the path rule (the query is not part of the path) ...
    send_to(&url, "/v1/batches/b1?case=met", &[]).await;
    // ... else the model rule (the request body's model is req-model).
    send(&url, "met", &[]).await;
    let s = proxy.settled(4.0).await;
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(slo(&s, "batch", "met"), 2.0, "{s}");
    assert_eq!(slo(&s, "interactive", "met"), 1.0, "{s}");
    assert_eq!(slo(&s, "agent", "met"), 1.0, "{s}");
    assert!(!s.contains("no-such-class"), "{s}");
}

#[tokio::test]
async fn llm_d_headers_set_the_request_targets() {
    let up = upstream::spawn(script).await;
    let proxy = spawn_proxy(&up.url(), &CLASSES).await;
    let url = proxy.url();
    let batch = ("x-tokenmeter-class", "batch");
    // batch has no targets; "steady" takes 200 ms to its first token and then streams at 25/s.
    send(&url, "steady", &[batch]).await;
    send(&url, "steady", &[batch, ("x-llm-d-slo-ttft-ms", "50")]).await;
    // A TPOT of 10 ms is a floor of 100 tokens/s.
    send(&url, "steady", &[batch, ("x-llm-d-slo-tpot-ms", "10")]).await;
    // A TPOT of 100 ms is a floor of 10 tokens/s: met.
    send(&url, "steady", &[batch, ("x-llm-d-slo-tpot-ms", "100")]).await;
    let s = proxy.settled(4.0).await;
    assert_eq!(slo(&s, "batch", "met"), 2.0, "{s}");
    assert_eq!(slo(&s, "batch", "ttft_missed"), 1.0, "{s}");
    assert_eq!(slo(&s, "batch", "tps_missed"), 1.0, "{s}");
}

#[tokio::test]
async fn gpus_and_their_cost_are_exported_with_the_source() {
    let up = upstream::spawn(script).await;
    let flags = ["--gpus", "2", "--gpu-hour-cost", "2.25"];
    let proxy = spawn_proxy(&up.url(), &flags).await;
    let s = proxy.scrape().await;
    assert_eq!(metric(names::GPUS).label("source", "flag").value(&s), 2.0);
    assert_eq!(metric(names::GPU_HOUR_COST).value(&s), 2.25);
    let proxy = spawn_proxy(&up.url(), &[]).await;
    let s = proxy.scrape().await;
    assert!(!s.contains("tokenmeter_gpu_hour_cost "), "{s}");
}

#[tokio::test]
async fn only_post_requests_are_judged() {
    let up = upstream::spawn(|r| {
        if r.method == "GET" {
            Reply::json(200, r#"{"object":"list","data":[{"id":"m"}]}"#)
        } else {
            script(r)
        }
    })
    .await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    let url = proxy.url();
    let models_url = format!("{url}/v1/models");
    let models = crate::support::client::send(http::Method::GET, &models_url, "").await;
    assert_eq!(models.status, 200);
    send(&url, "met", &[]).await;
    let s = proxy.settled(2.0).await;
    // Both are requests; only the POST is an inference a consumer waited for.
    assert_eq!(metric(names::REQUESTS_TOTAL).sum(&s), 2.0, "{s}");
    assert_eq!(metric(names::SLO_REQUESTS_TOTAL).sum(&s), 1.0, "{s}");
    assert_eq!(slo(&s, "interactive", "met"), 1.0, "{s}");
}

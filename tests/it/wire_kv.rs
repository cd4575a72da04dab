//! The wire's view of the KV cache (`tokenmeter_kv_cache_wire_tokens`) and, with `--compat
//! vllm` and a known cache, `vllm:kv_cache_usage_perc` made of it.
//!
//! Ten finished requests of 100 uncached prompt tokens make the capacity model's mix; then three
//! streams send 5 tokens each and hold: the requests in flight hold 3 x (100 + 5) = 315 tokens
//! by the wire's count, a third of a 945-token cache; when they end, nothing.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};

use tokenmeter::metrics::names;

use crate::support::metrics::metric;
use crate::support::upstream::{self, Reply, Step};
use crate::support::{client, spawn_proxy};

fn chunk(content: &str) -> Bytes {
    Bytes::from(format!(
        "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{content}\"}}}}]}}\n\n"
    ))
}

fn finished() -> Vec<Step> {
    let mut steps: Vec<Step> = (0..5)
        .map(|i| Step::Send(chunk(&format!("t{i}"))))
        .collect();
    steps.push(Step::Send(Bytes::from(
        "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":5,\"total_tokens\":105}}\n\ndata: [DONE]\n\n",
    )));
    steps
}

fn held() -> Vec<Step> {
    let mut steps: Vec<Step> = (0..5)
        .map(|i| Step::Send(chunk(&format!("t{i}"))))
        .collect();
    steps.push(Step::Hang);
    steps
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_requests_in_flight_hold_their_prompt_and_what_they_streamed() {
    let up = upstream::spawn(|r| {
        if r.path.ends_with("/hold") {
            Reply::sse(held())
        } else {
            Reply::sse(finished())
        }
    })
    .await;
    let proxy = spawn_proxy(&up.url(), &["--compat", "vllm", "--kv-cache-tokens", "945"]).await;
    let url = format!("{}/v1/chat/completions", proxy.url());
    for _ in 0..10 {
        let seen = client::post(&url, &client::chat_request(true, true)).await;
        assert_eq!(seen.status, 200);
    }
    proxy.settled(10.0).await;
    // Three streams that send 5 tokens and hold. Each is read until its 5 chunks are in.
    let mut bodies = Vec::new();
    for _ in 0..3 {
        let req = http::Request::post(format!("{url}/hold"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(client::chat_request(true, true))))
            .expect("request");
        let resp = client::client().request(req).await.expect("response");
        let mut body = resp.into_body();
        let mut got = Vec::new();
        while got.windows(6).filter(|w| w == b"data: ").count() < 5 {
            let frame = body.frame().await.expect("a frame").expect("data");
            if let Ok(d) = frame.into_data() {
                got.extend_from_slice(&d);
            }
        }
        bodies.push(body);
    }
    let start = Instant::now();
    let page = loop {
        proxy.capacity.next_report().await;
        let page = proxy.scrape().await;
        if metric(names::capacity::KV_WIRE_TOKENS).sum_or_zero_if_absent(&page) == 315.0 {
            break page;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "wire tokens never 315:\n{page}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Under the model the requests named, as vLLM labels it (its dashboard selects by it).
    let usage = metric("vllm:kv_cache_usage_perc")
        .label("model_name", "req-model")
        .label("engine", "tokenmeter")
        .value(&page);
    assert!((usage - 315.0 / 945.0).abs() < 1e-9, "{usage}");
    // They end (the clients go): nothing is held.
    drop(bodies);
    let start = Instant::now();
    loop {
        proxy.capacity.next_report().await;
        let page = proxy.scrape().await;
        if metric(names::REQUESTS_IN_FLIGHT).sum(&page) == 0.0 {
            assert_eq!(metric(names::capacity::KV_WIRE_TOKENS).value(&page), 0.0);
            assert_eq!(metric("vllm:kv_cache_usage_perc").value(&page), 0.0);
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the streams never ended:\n{page}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_known_cache_there_is_no_vllm_usage() {
    let up = upstream::spawn(|_| Reply::sse(finished())).await;
    let proxy = spawn_proxy(&up.url(), &["--compat", "vllm"]).await;
    let url = format!("{}/v1/chat/completions", proxy.url());
    for _ in 0..3 {
        client::post(&url, &client::chat_request(true, true)).await;
    }
    proxy.settled(3.0).await;
    proxy.capacity.next_report().await;
    let page = proxy.scrape().await;
    assert_eq!(metric(names::capacity::KV_WIRE_TOKENS).value(&page), 0.0);
    assert!(!page.contains("vllm:kv_cache_usage_perc{"), "{page}");
}

//! `--compat`: the same measurements under other naming schemes, beside tokenmeter's own.

use std::time::Duration;

use bytes::Bytes;

use crate::support::client::{self, chat_request};
use crate::support::metrics::metric;
use crate::support::spawn_proxy;
use crate::support::upstream::{self, Reply, Step};

const MS: Duration = Duration::from_millis(1);

/// A crafted OpenAI stream: 250 ms to the first of 20 tokens 20 ms apart, the model stopped at
/// its limit (`finish_reason: length`), usage 9 prompt / 20 completion tokens.
fn crafted() -> Vec<Step> {
    let mut steps = upstream::openai_chat(250 * MS, 20, 20 * MS, false);
    let done = steps.pop();
    steps.push(Step::Send(Bytes::from_static(
        b"data: {\"model\":\"test-model\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n",
    )));
    steps.push(Step::Send(Bytes::from_static(
        b"data: {\"model\":\"test-model\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":20,\"total_tokens\":29}}\n\n",
    )));
    steps.extend(done);
    steps
}

#[tokio::test]
async fn vllm_names_show_a_crafted_streams_ttft_latency_and_tokens() {
    let _turn = crate::support::serial().await;
    let up = upstream::spawn(|_| Reply::sse(crafted())).await;
    let proxy = spawn_proxy(&up.url(), &["--compat", "vllm"]).await;
    let seen = client::post(
        &format!("{}/v1/chat/completions", proxy.url()),
        &chat_request(true, true),
    )
    .await;
    assert_eq!(seen.status, 200);
    let s = proxy.settled(1.0).await;
    let v = |n: &str| {
        metric(n)
            .label("model_name", "test-model")
            .label("engine", "tokenmeter")
    };
    assert_eq!(v("vllm:generation_tokens_total").value(&s), 20.0);
    assert_eq!(v("vllm:prompt_tokens_total").value(&s), 9.0);
    assert_eq!(v("vllm:request_generation_tokens_sum").value(&s), 20.0);
    assert_eq!(v("vllm:request_prompt_tokens_sum").value(&s), 9.0);
    assert_eq!(
        v("vllm:request_success_total")
            .label("finished_reason", "length")
            .value(&s),
        1.0
    );
    // TTFT: at least the upstream's 250 ms, and the same figure as tokenmeter's own series.
    let ttft = v("vllm:time_to_first_token_seconds_sum").value(&s);
    let own = metric("tokenmeter_time_to_first_token_seconds_sum")
        .label("model", "test-model")
        .value(&s);
    assert!(ttft >= 0.25, "TTFT {ttft}");
    assert!((ttft - own).abs() < 1e-9, "vllm {ttft} vs tokenmeter {own}");
    let e2e = v("vllm:e2e_request_latency_seconds_sum").value(&s);
    let own = metric("tokenmeter_request_duration_seconds_sum")
        .label("model", "test-model")
        .value(&s);
    // 250 ms + 19 gaps of 20 ms at the least.
    assert!(e2e >= 0.25 + 19.0 * 0.02, "e2e {e2e}");
    assert!((e2e - own).abs() < 1e-9, "vllm {e2e} vs tokenmeter {own}");
    // One ITL observation per token-bearing event after the first (one token each here).
    assert_eq!(v("vllm:inter_token_latency_seconds_count").value(&s), 19.0);
    assert_eq!(
        v("vllm:request_time_per_output_token_seconds_count").value(&s),
        1.0
    );
    // Nothing in flight once the stream ended, and the gauges exist.
    assert_eq!(v("vllm:num_requests_running").value(&s), 0.0);
    // Waiting is counted under the model the request named (the stream has named none yet).
    let waiting = metric("vllm:num_requests_waiting").label("model_name", "req-model");
    assert_eq!(waiting.value(&s), 0.0);
    // The tokenmeter series stay.
    assert_eq!(
        metric("tokenmeter_output_tokens_total")
            .label("model", "test-model")
            .value(&s),
        20.0
    );
    // What the wire cannot show is absent, not faked.
    for absent in [
        "vllm:kv_cache_usage_perc",
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:prefix_cache_hits",
    ] {
        assert!(!s.contains(absent), "{absent} in\n{s}");
    }
}

#[tokio::test]
async fn vllm_waiting_and_running_follow_a_live_request() {
    let _turn = crate::support::serial().await;
    // 400 ms to the first token, then 400 ms of tokens: the scrape at 200 ms sees it waiting,
    // the one at 600 ms sees it running.
    let up =
        upstream::spawn(|_| Reply::sse(upstream::openai_chat(400 * MS, 9, 50 * MS, true))).await;
    let proxy = spawn_proxy(&up.url(), &["--compat", "vllm"]).await;
    let url = format!("{}/v1/chat/completions", proxy.url());
    let body = chat_request(true, true);
    let req = tokio::spawn(async move { client::post(&url, &body).await });
    // Waiting under the model the request named, running under the one the stream named.
    let g = |n: &str| {
        let model = match n {
            "vllm:num_requests_waiting" => "req-model",
            _ => "test-model",
        };
        metric(n)
            .label("model_name", model)
            .label("engine", "tokenmeter")
    };
    tokio::time::sleep(200 * MS).await;
    let s = proxy.scrape().await;
    assert_eq!(g("vllm:num_requests_waiting").value(&s), 1.0, "{s}");
    assert_eq!(g("vllm:num_requests_running").sum(&s), 0.0);
    tokio::time::sleep(400 * MS).await;
    let s = proxy.scrape().await;
    assert_eq!(g("vllm:num_requests_waiting").value(&s), 0.0, "{s}");
    assert_eq!(g("vllm:num_requests_running").value(&s), 1.0);
    assert_eq!(req.await.expect("request").status, 200);
    let s = proxy.settled(1.0).await;
    assert_eq!(g("vllm:num_requests_running").value(&s), 0.0);
    assert_eq!(
        g("vllm:request_success_total")
            .label("finished_reason", "stop")
            .value(&s),
        1.0
    );
}

#[tokio::test]
async fn without_compat_there_is_no_vllm_series() {
    let _turn = crate::support::serial().await;
    let up = upstream::spawn(|_| Reply::sse(crafted())).await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    let seen = client::post(
        &format!("{}/v1/chat/completions", proxy.url()),
        &chat_request(true, true),
    )
    .await;
    assert_eq!(seen.status, 200);
    let s = proxy.settled(1.0).await;
    assert!(!s.contains("vllm:"), "{s}");
}

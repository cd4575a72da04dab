//! `--compat`: the same measurements under other naming schemes, beside tokenmeter's own.

use std::time::Duration;

use bytes::Bytes;

use tokenmeter::metrics::names;

use crate::support::client::{self, chat_request};
use crate::support::metrics::metric;
use crate::support::upstream::{self, Reply, Step};
use crate::support::{promtool, spawn_proxy, start_sim, stream_once, Streamed};

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
    let Streamed {
        seen, scrape: s, ..
    } = stream_once(crafted(), &["--compat", "vllm"]).await;
    assert_eq!(seen.status, 200);
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
        metric(names::OUTPUT_TOKENS_TOTAL)
            .label("model", "test-model")
            .value(&s),
        20.0
    );
    // What the wire cannot show, and what this stream does not state (no `metrics`), is absent.
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
async fn without_compat_there_is_no_vllm_or_otel_series() {
    let Streamed {
        seen, scrape: s, ..
    } = stream_once(crafted(), &[]).await;
    assert_eq!(seen.status, 200);
    assert!(!s.contains("vllm:"), "{s}");
    assert!(!s.contains("gen_ai_"), "{s}");
    assert!(!s.contains("otel_scope_"), "{s}");
}

// === --compat otel ===

/// The OTel families and their label names (without `le` and the scope's), as the
/// conventions (v1.41.0) and the OTel Prometheus exporter's spelling give them.
const OTEL_FAMILIES: [(&str, &[&str]); 4] = [
    ("gen_ai_server_time_to_first_token_seconds", &OTEL_LABELS),
    ("gen_ai_server_time_per_output_token_seconds", &OTEL_LABELS),
    (
        "gen_ai_server_request_duration_seconds",
        &[
            "error_type",
            "gen_ai_operation_name",
            "gen_ai_provider_name",
            "gen_ai_request_model",
            "gen_ai_response_model",
        ],
    ),
    (
        "gen_ai_client_token_usage",
        &[
            "gen_ai_operation_name",
            "gen_ai_provider_name",
            "gen_ai_request_model",
            "gen_ai_response_model",
            "gen_ai_token_type",
        ],
    ),
];

const OTEL_LABELS: [&str; 4] = [
    "gen_ai_operation_name",
    "gen_ai_provider_name",
    "gen_ai_request_model",
    "gen_ai_response_model",
];

/// The label names (sorted, without `le` and `otel_scope_*`) of every `_bucket` series of a
/// family, deduplicated.
fn label_names(scrape: &str, family: &str) -> Vec<Vec<String>> {
    let parsed = tokenmeter_tools::exposition::Scrape::parse(scrape);
    let mut sets: Vec<Vec<String>> = parsed
        .samples()
        .iter()
        .filter(|s| s.name == format!("{family}_bucket"))
        .map(|s| {
            let mut names: Vec<String> = s
                .labels
                .iter()
                .map(|(k, _)| k.clone())
                .filter(|k| k != "le" && !k.starts_with("otel_scope_"))
                .collect();
            names.sort();
            names
        })
        .collect();
    sets.sort();
    sets.dedup();
    sets
}

#[tokio::test]
async fn otel_names_show_a_crafted_streams_tokens_ttft_and_attributes() {
    let _turn = crate::support::serial().await;
    let Streamed {
        seen, scrape: s, ..
    } = stream_once(crafted(), &["--compat", "otel"]).await;
    assert_eq!(seen.status, 200);
    for (family, labels) in OTEL_FAMILIES {
        assert_eq!(
            label_names(&s, family),
            [labels.iter().map(|l| l.to_string()).collect::<Vec<_>>()],
            "{family} in\n{s}"
        );
        assert!(
            s.contains(&format!("# TYPE {family} histogram\n")),
            "{family}"
        );
    }
    // The request named req-model, the stream test-model; chat on an OpenAI-format stream.
    let o = |n: &str| {
        metric(n)
            .label("gen_ai_operation_name", "chat")
            .label("gen_ai_provider_name", "openai")
            .label("gen_ai_request_model", "req-model")
            .label("gen_ai_response_model", "test-model")
            .label("otel_scope_name", "tokenmeter")
    };
    // Exact token counts: usage said 9 prompt and 20 completion tokens.
    let usage = |kind: &str| o("gen_ai_client_token_usage_sum").label("gen_ai_token_type", kind);
    assert_eq!(usage("input").value(&s), 9.0);
    assert_eq!(usage("output").value(&s), 20.0);
    assert_eq!(
        o("gen_ai_client_token_usage_count")
            .label("gen_ai_token_type", "output")
            .value(&s),
        1.0
    );
    // TTFT: the same observation as tokenmeter's own series.
    let ttft = o("gen_ai_server_time_to_first_token_seconds_sum").value(&s);
    let own = metric("tokenmeter_time_to_first_token_seconds_sum")
        .label("model", "test-model")
        .value(&s);
    assert!(ttft >= 0.25, "TTFT {ttft}");
    assert!((ttft - own).abs() < 1e-9, "otel {ttft} vs tokenmeter {own}");
    let e2e = o("gen_ai_server_request_duration_seconds_sum")
        .label("error_type", "")
        .value(&s);
    let own = metric("tokenmeter_request_duration_seconds_sum")
        .label("model", "test-model")
        .value(&s);
    assert!((e2e - own).abs() < 1e-9, "otel {e2e} vs tokenmeter {own}");
    // TPOT: decode time over the 19 tokens after the first, the same as tokenmeter's.
    let tpot = o("gen_ai_server_time_per_output_token_seconds_sum").value(&s);
    let own = metric("tokenmeter_time_per_output_token_seconds_sum")
        .label("model", "test-model")
        .value(&s);
    assert!(tpot >= 0.02, "TPOT {tpot}");
    assert!((tpot - own).abs() < 1e-9, "otel {tpot} vs tokenmeter {own}");
    // A success has no error type, and the tokenmeter series stay.
    assert_eq!(
        metric("gen_ai_server_request_duration_seconds_count")
            .label("error_type", "upstream_error")
            .sum(&s),
        0.0
    );
    assert_eq!(
        metric(names::OUTPUT_TOKENS_TOTAL)
            .label("model", "test-model")
            .value(&s),
        20.0
    );
    assert!(!s.contains("vllm:"), "only the schemes asked for");
}

#[tokio::test]
async fn otel_error_type_names_a_failed_request_by_its_outcome() {
    // Three tokens, then the upstream resets the stream.
    let mut steps = upstream::openai_chat(10 * MS, 3, 5 * MS, false);
    steps.truncate(7);
    steps.push(Step::Abort);
    let Streamed { scrape: s, .. } = stream_once(steps, &["--compat", "otel"]).await;
    let failed = metric("gen_ai_server_request_duration_seconds_count")
        .label("error_type", "upstream_error")
        .label("gen_ai_operation_name", "chat");
    assert_eq!(failed.value(&s), 1.0, "{s}");
    // Only successful responses have a TTFT or a TPOT.
    assert_eq!(
        metric("gen_ai_server_time_to_first_token_seconds_count").sum_or_zero_if_absent(&s),
        0.0
    );
    assert_eq!(
        metric("tokenmeter_time_to_first_token_seconds_count").sum(&s),
        1.0
    );
    // An upstream that is not there: named by the path alone.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let proxy = spawn_proxy(&format!("http://127.0.0.1:{port}"), &["--compat", "otel"]).await;
    let seen = client::post(
        &format!("{}/v1/messages", proxy.url()),
        &chat_request(true, false),
    )
    .await;
    assert_eq!(seen.status, 502);
    let s = proxy.settled(1.0).await;
    assert_eq!(
        metric("gen_ai_server_request_duration_seconds_count")
            .label("error_type", "upstream_error")
            .label("gen_ai_operation_name", "chat")
            .label("gen_ai_provider_name", "anthropic")
            .label("gen_ai_request_model", "req-model")
            .label("gen_ai_response_model", "")
            .value(&s),
        1.0,
        "{s}"
    );
}

#[tokio::test]
async fn otel_token_usage_through_the_simulator_is_exact_per_operation() {
    let sim = start_sim(tokenmeter_tools::sim::SimConfig {
        model: tokenmeter_tools::sim::Model {
            step_base: MS,
            step_per_seq: Duration::ZERO,
            ..tokenmeter_tools::sim::SimConfig::default().model
        },
        ..tokenmeter_tools::sim::SimConfig::default()
    })
    .await;
    let proxy = spawn_proxy(&format!("http://{sim}"), &["--compat", "vllm,otel"]).await;
    let chat = r#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":17,"messages":[{"role":"user","content":"Say something."}]}"#;
    let completion = r#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":23,"prompt":"Once upon a time"}"#;
    for (path, body) in [
        ("/v1/chat/completions", chat),
        ("/v1/completions", completion),
    ] {
        let seen = client::post(&format!("{}{path}", proxy.url()), body).await;
        assert_eq!(seen.status, 200, "{path}");
    }
    let s = proxy.settled(2.0).await;
    let output = |op: &str| {
        metric("gen_ai_client_token_usage_sum")
            .label("gen_ai_operation_name", op)
            .label("gen_ai_token_type", "output")
            .sum(&s)
    };
    // The simulator answers exactly max_tokens tokens, and reports them in its usage.
    assert_eq!(output("chat"), 17.0, "{s}");
    assert_eq!(output("text_completion"), 23.0, "{s}");
    let input = metric("gen_ai_client_token_usage_sum")
        .label("gen_ai_token_type", "input")
        .sum(&s);
    assert_eq!(
        input,
        metric(names::INPUT_TOKENS_TOTAL).sum(&s),
        "prompt tokens as tokenmeter counts them"
    );
    assert!(input > 0.0);
    // Both schemes at once, from the same records.
    assert_eq!(
        metric("vllm:generation_tokens_total").sum(&s),
        output("chat") + output("text_completion")
    );
    assert_eq!(
        metric("gen_ai_server_time_to_first_token_seconds_count").sum(&s),
        2.0
    );
    // promtool accepts the otel names as they are, and only the colon lint on vllm's.
    if let Some(lint) = promtool::lint(&s) {
        let other: Vec<&String> = lint
            .iter()
            .filter(|l| !promtool::is_vllm_colon_lint(l))
            .collect();
        assert!(other.is_empty(), "promtool check metrics:\n{lint:?}");
    }
}

#[tokio::test]
async fn vllm_generation_tokens_move_while_the_stream_runs() {
    let _turn = crate::support::serial().await;
    // 10 tokens 100 ms apart: the scrape at 500 ms sees some of them counted already.
    let up =
        upstream::spawn(|_| Reply::sse(upstream::openai_chat(10 * MS, 10, 100 * MS, true))).await;
    let proxy = spawn_proxy(&up.url(), &["--compat", "vllm"]).await;
    let url = format!("{}/v1/chat/completions", proxy.url());
    let body = chat_request(true, true);
    let req = tokio::spawn(async move { client::post(&url, &body).await });
    tokio::time::sleep(500 * MS).await;
    let s = proxy.scrape().await;
    let live = metric("vllm:generation_tokens_total").sum(&s);
    let own = metric(names::OUTPUT_TOKENS_TOTAL).sum(&s);
    assert!((1.0..10.0).contains(&live), "mid-stream: {live}");
    assert_eq!(live, own, "vllm and tokenmeter move together");
    assert_eq!(req.await.expect("request").status, 200);
    let s = proxy.settled(1.0).await;
    assert_eq!(metric("vllm:generation_tokens_total").sum(&s), 10.0);
}

#[tokio::test]
async fn promtool_accepts_the_otel_exposition() {
    let Streamed { scrape: s, .. } = stream_once(
        upstream::openai_chat(MS, 5, MS, true),
        &["--compat", "otel"],
    )
    .await;
    assert!(s.contains("gen_ai_server_time_to_first_token_seconds_bucket"));
    if let Some(lint) = promtool::lint(&s) {
        assert!(
            lint.is_empty(),
            "promtool check metrics:\n{}",
            lint.join("\n")
        );
    }
}

//! What the wire shows: crafted streams from a scripted upstream give exactly the
//! expected prompt bands, first-output times per kind, tokens per event, longest stall, reasoning
//! and cached tokens, and an output counter that moves while a stream runs and is settled by the
//! usage report.
//!
//! Timings: the upstream's sleeps are lower bounds (a loaded machine can only stretch them), and
//! the client's own frame times are upper bounds (the proxy sees each frame before the client).

use std::time::Duration;

use bytes::Bytes;

use tokenmeter::metrics::names;

use crate::support::client::{self, Seen};
use crate::support::metrics::metric;
use crate::support::spawn_proxy;
use crate::support::upstream::{self, Reply, Step};

const MS: Duration = Duration::from_millis(1);

/// How much shorter than the upstream's own pause two stamps of the proxy may be: each frame is
/// stamped when the proxy's task polls it, and a poll of the earlier frame made late by the
/// tests running beside this one (up to 0.8 ms seen on two cores) shortens the gap after it.
const LATE_POLL: f64 = 0.003;

fn data(json: &str) -> Step {
    Step::Send(Bytes::from(format!("data: {json}\n\n")))
}

fn event(name: &str, json: &str) -> Step {
    Step::Send(Bytes::from(format!("event: {name}\ndata: {json}\n\n")))
}

fn chunk(delta: &str) -> Step {
    data(&format!(
        r#"{{"model":"r1","choices":[{{"index":0,"delta":{delta}}}]}}"#
    ))
}

/// The client's arrival time of the first frame containing `needle`.
fn client_time(seen: &Seen, needle: &str) -> f64 {
    let needle = needle.as_bytes();
    seen.frames
        .iter()
        .find(|(_, b)| b.windows(needle.len()).any(|w| w == needle))
        .map(|(t, _)| t.as_secs_f64())
        .expect("frame seen by the client")
}

/// A reasoning model's stream: a role-only first chunk, three reasoning deltas, a 300 ms stall,
/// two content deltas, one tool-call delta, then usage with reasoning and cached details.
fn reasoning_stream() -> Vec<Step> {
    vec![
        Step::Sleep(100 * MS),
        chunk(r#"{"role":"assistant","content":""}"#),
        Step::Sleep(50 * MS),
        chunk(r#"{"reasoning_content":"Let"}"#),
        Step::Sleep(10 * MS),
        chunk(r#"{"reasoning_content":" me"}"#),
        Step::Sleep(10 * MS),
        chunk(r#"{"reasoning_content":" think"}"#),
        Step::Sleep(300 * MS),
        chunk(r#"{"content":"The"}"#),
        Step::Sleep(10 * MS),
        chunk(r#"{"content":" answer"}"#),
        Step::Sleep(10 * MS),
        chunk(r#"{"tool_calls":[{"index":0,"function":{"name":"f","arguments":"{"}}]}"#),
        data(
            r#"{"model":"r1","choices":[],"usage":{"prompt_tokens":300,"completion_tokens":9,"prompt_tokens_details":{"cached_tokens":256},"completion_tokens_details":{"reasoning_tokens":5}}}"#,
        ),
        data("[DONE]"),
    ]
}

#[tokio::test]
async fn a_reasoning_stream_gives_kinds_stall_band_and_usage_details() {
    let _turn = crate::support::serial().await;
    let up = upstream::spawn(|_| Reply::sse(reasoning_stream())).await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    let seen = client::post(&format!("{}/v1/chat/completions", proxy.url()), "{}").await;
    assert_eq!(seen.status, 200);
    let s = proxy.settled(1.0).await;
    let m = |n: &str| metric(n).label("model", "r1");

    // TTFT: the first reasoning delta, never the role-only chunk (150 ms, not 100 ms), in the
    // band of the 300 prompt tokens the final usage reported.
    let ttft = m("tokenmeter_time_to_first_token_seconds_sum")
        .label("prompt", "257-1k")
        .value(&s);
    let client_reasoning = client_time(&seen, "reasoning_content\":\"Let");
    assert!(
        (0.15..=client_reasoning).contains(&ttft),
        "TTFT {ttft}: at least 150 ms, at most the client's {client_reasoning}"
    );
    assert_eq!(
        m("tokenmeter_time_to_first_token_seconds_count").value(&s),
        1.0
    );
    let first = |kind: &str| {
        m("tokenmeter_time_to_first_output_seconds_sum")
            .label("kind", kind)
            .value(&s)
    };
    // The first reasoning output is the TTFT itself (one event, one clock reading).
    assert_eq!(first("reasoning"), ttft);
    let (content, tool) = (first("content"), first("tool_call"));
    let client_content = client_time(&seen, "\"content\":\"The");
    let client_tool = client_time(&seen, "tool_calls");
    assert!(
        (ttft + 0.32 - LATE_POLL..=client_content).contains(&content),
        "content {content}: 320 ms after TTFT {ttft}, at most the client's {client_content}"
    );
    assert!(
        (content + 0.02 - LATE_POLL..=client_tool).contains(&tool),
        "tool call {tool}: 20 ms after content {content}, at most the client's {client_tool}"
    );

    // The longest gap between token-bearing events is the 300 ms stall (TTFT not counted); the
    // client saw the same gap, give or take how late each frame reached it (50 ms tolerance).
    let stall = m("tokenmeter_request_max_stall_seconds_sum").value(&s);
    let client_gap = client_content - client_time(&seen, "\" think");
    assert!(
        stall >= 0.3 && stall <= client_gap + 0.05,
        "stall {stall}: at least 300 ms, about the client's {client_gap}"
    );
    assert_eq!(
        m("tokenmeter_request_max_stall_seconds_count").value(&s),
        1.0
    );

    // Six token-bearing events of one token each (no token ids, no running usage).
    assert_eq!(m("tokenmeter_tokens_per_event_count").value(&s), 6.0);
    assert_eq!(m("tokenmeter_tokens_per_event_sum").value(&s), 6.0);
    // Usage's details, and usage's output count (9) settles the 6 counted as they streamed.
    assert_eq!(m(names::REASONING_TOKENS_TOTAL).value(&s), 5.0);
    assert_eq!(m(names::OUTPUT_TOKENS_TOTAL).value(&s), 9.0);
    assert_eq!(
        m(names::CACHED_INPUT_TOKENS_TOTAL)
            .label("kind", "read")
            .value(&s),
        256.0
    );
    assert_eq!(
        m(names::CACHED_INPUT_TOKENS_TOTAL)
            .label("kind", "write")
            .sum(&s),
        0.0
    );
}

/// An Anthropic stream states its prompt in `message_start`: the TTFT is observed while the
/// stream runs, and the output counter moves before the request ends.
#[tokio::test]
async fn anthropic_thinking_counts_live_and_its_band_is_known_at_once() {
    let _turn = crate::support::serial().await;
    let delta = |kind: &str, field: &str, text: &str| {
        event(
            "content_block_delta",
            &format!(
                r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"{kind}","{field}":"{text}"}}}}"#
            ),
        )
    };
    let steps = vec![
        event(
            "message_start",
            r#"{"type":"message_start","message":{"model":"claude","usage":{"input_tokens":5000,"cache_creation_input_tokens":4096,"cache_read_input_tokens":0,"output_tokens":1}}}"#,
        ),
        Step::Sleep(50 * MS),
        delta("thinking_delta", "thinking", "Hmm"),
        delta("thinking_delta", "thinking", " ok"),
        delta("signature_delta", "signature", "EqQB"),
        delta("text_delta", "text", "Hi"),
        // Held open long enough to scrape mid-stream.
        Step::Sleep(1500 * MS),
        event(
            "message_delta",
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":7}}"#,
        ),
        event("message_stop", r#"{"type":"message_stop"}"#),
    ];
    let up = upstream::spawn(move |_| Reply::sse(steps.clone())).await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    let url = format!("{}/v1/messages", proxy.url());
    let task = tokio::spawn(async move { client::post(&url, "{}").await });
    let m = |n: &str| metric(n).label("model", "claude");
    let live = proxy
        .eventually(|s| m(names::OUTPUT_TOKENS_TOTAL).sum_or_zero_if_absent(s) == 3.0)
        .await;
    assert_eq!(
        metric(names::REQUESTS_TOTAL).sum_or_zero_if_absent(&live),
        0.0,
        "{live}"
    );
    assert_eq!(m(names::OUTPUT_TOKENS_TOTAL).value(&live), 3.0);
    assert_eq!(
        m("tokenmeter_time_to_first_token_seconds_count")
            .label("prompt", "4k-16k")
            .value(&live),
        1.0
    );
    assert!(task
        .await
        .expect("join")
        .body
        .ends_with(b"{\"type\":\"message_stop\"}\n\n"));
    let s = proxy.settled(1.0).await;
    // Usage's 7 settles the 3 that streamed; the two thinking deltas are the reasoning count
    // (Anthropic reports no reasoning count of its own).
    assert_eq!(m(names::OUTPUT_TOKENS_TOTAL).value(&s), 7.0);
    assert_eq!(m(names::REASONING_TOKENS_TOTAL).value(&s), 2.0);
    assert_eq!(
        m(names::CACHED_INPUT_TOKENS_TOTAL)
            .label("kind", "write")
            .value(&s),
        4096.0
    );
    assert_eq!(
        m(names::CACHED_INPUT_TOKENS_TOTAL)
            .label("kind", "read")
            .value(&s),
        0.0
    );
    assert_eq!(
        m("tokenmeter_time_to_first_token_seconds_count").value(&s),
        1.0,
        "TTFT observed once"
    );
    let reasoning = m("tokenmeter_time_to_first_output_seconds_sum")
        .label("kind", "reasoning")
        .value(&s);
    let content = m("tokenmeter_time_to_first_output_seconds_sum")
        .label("kind", "content")
        .value(&s);
    assert!(
        reasoning >= 0.05 && content >= reasoning,
        "{reasoning} {content}"
    );
    assert_eq!(
        m("tokenmeter_time_to_first_output_seconds_count")
            .label("kind", "tool_call")
            .sum(&s),
        0.0
    );
}

/// vLLM's token ids: each event observes the tokens it carried; a stream without usage has no
/// prompt count, so its TTFT is in the `unknown` band, observed when the request ends.
#[tokio::test]
async fn token_ids_give_tokens_per_event_and_no_usage_is_unknown_band() {
    let ids = |content: &str, ids: &str| {
        data(&format!(
            r#"{{"model":"spec","choices":[{{"index":0,"delta":{{"content":"{content}"}},"token_ids":{ids}}}]}}"#
        ))
    };
    let steps = vec![
        ids("ab", "[1,2]"),
        ids("cde", "[3,4,5]"),
        ids("f", "[6]"),
        ids("ghij", "[7,8,9,10]"),
        data("[DONE]"),
    ];
    let up = upstream::spawn(move |_| Reply::sse(steps.clone())).await;
    let proxy = spawn_proxy(&up.url(), &[]).await;
    client::post(&format!("{}/v1/chat/completions", proxy.url()), "{}").await;
    let s = proxy.settled(1.0).await;
    let m = |n: &str| metric(n).label("model", "spec");
    let bucket = |le: &str| {
        m("tokenmeter_tokens_per_event_bucket")
            .label("le", le)
            .value(&s)
    };
    assert_eq!(
        [
            bucket("1"),
            bucket("2"),
            bucket("3"),
            bucket("4"),
            bucket("+Inf")
        ],
        [1.0, 2.0, 3.0, 4.0, 4.0]
    );
    assert_eq!(m("tokenmeter_tokens_per_event_sum").value(&s), 10.0);
    assert_eq!(m(names::OUTPUT_TOKENS_TOTAL).value(&s), 10.0);
    assert_eq!(
        m("tokenmeter_time_to_first_token_seconds_count")
            .label("prompt", "unknown")
            .value(&s),
        1.0
    );
    assert_eq!(
        m(names::REASONING_TOKENS_TOTAL).sum_or_zero_if_absent(&s),
        0.0
    );
    assert_eq!(
        m(names::CACHED_INPUT_TOKENS_TOTAL).sum_or_zero_if_absent(&s),
        0.0
    );
}
